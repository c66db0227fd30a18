"""Reads for the model library: what the pages and the API show."""
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
