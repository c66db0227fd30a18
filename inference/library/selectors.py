"""Reads for the model library: what the pages and the API show."""
import shutil

from django.conf import settings
from django.http import Http404
from django.utils.translation import gettext

from inference.models import ModelArtifact


def model_list():
    return list(ModelArtifact.objects.all())


def model_get(artifact_id):
    return ModelArtifact.objects.filter(pk=artifact_id).first()


def model_active_in_folder(folder, *, exclude_id=None):
    """Rows that are queued or working on files in `folder`."""
    rows = ModelArtifact.objects.filter(folder=folder, status__in=ModelArtifact.ACTIVE)
    if exclude_id is not None:
        rows = rows.exclude(pk=exclude_id)
    return list(rows)


def model_files_claimed_by_others(artifact):
    """Relative paths in this row's folder that another row also lists."""
    claimed = set()
    for other in ModelArtifact.objects.filter(folder=artifact.folder).exclude(pk=artifact.pk):
        claimed.update(f["path"] for f in other.files if isinstance(f, dict) and "path" in f)
        claimed.update(other.recorded_hashes)
    return claimed


def models_to_resume_on(host):
    """Rows of this host that a worker start should pick up again."""
    return list(ModelArtifact.objects.filter(host=host, status__in=ModelArtifact.ACTIVE))


def model_get_or_404(artifact_id):
    artifact = model_get(artifact_id)
    if artifact is None:
        raise Http404(gettext("No model #%(id)s.") % {"id": artifact_id})
    return artifact


def models_disk():
    """Free and total bytes of the models folder's disk."""
    usage = shutil.disk_usage(settings.MODELS_DIR)
    return {"folder": str(settings.MODELS_DIR), "free": usage.free, "total": usage.total}
