"""Batch jobs: reads."""

from __future__ import annotations

from django.db.models import Q

from inference.models import Batch, BatchFile, BatchLine, Deployment


def _mine(qs, user_id):
    return qs.filter(user_id=user_id) if user_id is not None else qs.none()


def files_for(user_id, *, purpose=None, limit=20, after=None) -> list[BatchFile]:
    qs = _mine(BatchFile.objects.all(), user_id)
    if purpose:
        qs = qs.filter(purpose=purpose)
    if after:
        anchor = qs.filter(pk=after).first()
        if anchor is not None:
            qs = qs.filter(Q(created__lt=anchor.created) | Q(created=anchor.created, pk__lt=anchor.pk))
    return list(qs.order_by("-created", "-pk")[:limit])


def file_for(user_id, file_id) -> BatchFile | None:
    if "\x00" in file_id:  # no id has one; PostgreSQL would refuse the lookup (a body's input_file_id)
        return None
    return _mine(BatchFile.objects.all(), user_id).filter(pk=file_id).first()


def committed_size(f: BatchFile) -> int:
    """Bytes of the file a reader may see: for an output or error file only what is recorded."""
    batch = Batch.objects.filter(Q(output_file=f) | Q(error_file=f)).values(
        "output_file_id", "output_size", "error_size").first()
    if batch is None:
        return f.bytes
    return batch["output_size"] if batch["output_file_id"] == f.pk else batch["error_size"]


def batches_for(user_id, *, limit=20, after=None) -> list[Batch]:
    qs = _mine(Batch.objects.all(), user_id)
    if after:
        anchor = qs.filter(pk=after).first()
        if anchor is not None:
            qs = qs.filter(Q(created__lt=anchor.created) | Q(created=anchor.created, pk__lt=anchor.pk))
    return list(qs.order_by("-created", "-pk")[:limit])


def batch_for(user_id, batch_id) -> Batch | None:
    return _mine(Batch.objects.all(), user_id).filter(pk=batch_id).first()


# ---------------------------------------------------------------- pages (every user reads every batch)
def batch_list(limit=100) -> list[Batch]:
    return list(Batch.objects.select_related("deployment", "user", "input_file").order_by("-created")[:limit])


def batch_get(batch_id) -> Batch | None:
    return Batch.objects.select_related("deployment", "user", "input_file").filter(pk=batch_id).first()


def batch_lines(batch, *, q="", status="", page=1, per_page=50):
    qs = BatchLine.objects.filter(batch=batch)
    if status:
        qs = qs.filter(status=status)
    if q:
        qs = qs.filter(custom_id__icontains=q)
    from django.core.paginator import Paginator

    return Paginator(qs.order_by("line").only("line", "custom_id", "status", "attempts", "status_code", "error",
                                               "tokens"), per_page).get_page(page)


def ready_deployments() -> list[Deployment]:
    return list(Deployment.objects.filter(status=Deployment.Status.READY).exclude(served_model_name="")
                .order_by("name"))
