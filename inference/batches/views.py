"""The Batches pages: list + new batch (upload or paste), a batch's live progress and lines."""

from __future__ import annotations

import os

from django.contrib import messages
from django.http import Http404, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_POST

from dashboard.roles import is_operator, operator_required
from inference.batches import schemas, selectors, services
from inference.batches.forms import BatchForm
from inference.batches.storage import BatchUploadHandler
from inference.models import BatchLine, Deployment


@require_GET
def batch_list(request):
    deployments = selectors.ready_deployments()
    return render(request, "batches/batches.html", {
        "batches": selectors.batch_list(), "form": BatchForm(deployments=deployments),
        "deployments": deployments})


# The upload handler must be set before anything reads the body; CSRF's check
# reads request.POST, so it runs inside, after the handler is in place.
@csrf_exempt
@require_POST
@operator_required
def batch_new(request):
    request.upload_handlers = [BatchUploadHandler(request)]
    return _batch_new(request)


@csrf_protect
def _batch_new(request):
    handler = request.upload_handlers[0]
    try:
        deployments = selectors.ready_deployments()
        form = BatchForm(request.POST, deployments=deployments)
        if not form.is_valid():
            messages.error(request, _("The batch was not started: %(errors)s") % {
                "errors": "; ".join(f"{form.fields[k].label if k in form.fields else k}: {' '.join(v)}"
                                    for k, v in form.errors.items())})
            return redirect("batches")
        deployment = Deployment.objects.get(pk=form.cleaned_data["deployment"])
        try:
            if handler.incoming is not None and handler.incoming.size:
                incoming, handler.incoming = handler.incoming, None
                input_file = services.file_store(incoming, user=request.user)
            elif form.cleaned_data["text"].strip():
                input_file = services.file_from_text(form.cleaned_data["text"], user=request.user)
            else:
                messages.error(request, _("Choose a JSONL file or paste its lines."))
                return redirect("batches")
            batch = services.batch_create(
                user=request.user, input_file=input_file, endpoint=form.cleaned_data["endpoint"],
                deployment=deployment, concurrency=form.cleaned_data["concurrency"],
                pacing_ms=form.cleaned_data["pacing_ms"] or 0)
        except services.Refused as exc:
            messages.error(request, exc.message)
            return redirect("batches")
        messages.success(request, _("Batch %(id)s started.") % {"id": batch.pk})
        return redirect("batch_detail", batch_id=batch.pk)
    finally:
        if handler.incoming is not None:
            handler.incoming.discard()


def _get(batch_id):
    batch = selectors.batch_get(batch_id)
    if batch is None:
        raise Http404(_("No batch %(id)s.") % {"id": batch_id})
    return batch


def _may_see_content(user, batch) -> bool:
    """A batch's files and lines hold its owner's prompts and answers: the
    owner and operators see them; other viewers see only its progress."""
    return (batch.user_id is not None and batch.user_id == user.pk) or is_operator(user)


@require_GET
def batch_detail(request, batch_id):
    batch = _get(batch_id)
    q = request.GET.get("q", "").strip()[:200]
    status = request.GET.get("status", "")
    if status not in BatchLine.Status.values:
        status = ""
    content = _may_see_content(request.user, batch)
    return render(request, "batches/batch_detail.html", {
        "batch": batch, "progress": schemas.batch_progress(batch), "may_see_content": content,
        "lines": selectors.batch_lines(batch, q=q, status=status, page=request.GET.get("page", 1)) if content else None,
        "q": q, "status": status, "statuses": BatchLine.Status.choices,
        "can_cancel": not batch.is_finished and batch.status != "cancelling",
        "can_resume": batch.status in ("cancelled", "failed", "paused"),
    })


@require_GET
def batch_progress(request, batch_id):
    return JsonResponse(schemas.batch_progress(_get(batch_id)))


@require_POST
@operator_required
def batch_cancel(request, batch_id):
    services.batch_cancel(_get(batch_id))
    messages.success(request, _("Cancelling: lines being sent finish, the rest are not sent."))
    return redirect("batch_detail", batch_id=batch_id)


@require_POST
@operator_required
def batch_resume(request, batch_id):
    try:
        services.batch_resume(_get(batch_id))
    except services.Refused as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, _("Resumed: lines without a result are sent; lines with one are not sent again."))
    return redirect("batch_detail", batch_id=batch_id)


@require_GET
def batch_download(request, batch_id, which):
    batch = _get(batch_id)
    if not _may_see_content(request.user, batch):
        return render(request, "403.html", {
            "message": _("Only the batch's owner and operators may download its files.")}, status=403)
    files = {"input": (batch.input_file, batch.input_file.bytes if batch.input_file else 0),
             "output": (batch.output_file, batch.output_size), "errors": (batch.error_file, batch.error_size)}
    if which not in files or files[which][0] is None:
        raise Http404(_("No such file for this batch."))
    f, size = files[which]

    def chunks():
        with open(f.path, "rb") as handle:
            left = size
            while left > 0:
                data = handle.read(min(1 << 20, left))
                if not data:
                    break
                left -= len(data)
                yield data

    response = StreamingHttpResponse(chunks(), content_type="application/jsonl")
    response["Content-Length"] = str(size)
    response["Content-Disposition"] = f'attachment; filename="{batch.pk}_{which}.jsonl"'
    return response
