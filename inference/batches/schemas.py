"""The JSON objects of OpenAI's Files and Batches APIs, from rows."""

from __future__ import annotations


def _ts(value):
    return int(value.timestamp()) if value else None


def file_object(f) -> dict:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": _ts(f.created), "filename": f.filename,
            "purpose": f.purpose, "status": "processed", "status_details": None}


def batch_object(b) -> dict:
    return {
        "id": b.id, "object": "batch", "endpoint": b.endpoint, "errors": b.errors,
        "input_file_id": b.input_file_id, "completion_window": b.completion_window, "status": b.status,
        "output_file_id": b.output_file_id, "error_file_id": b.error_file_id,
        "created_at": _ts(b.created), "in_progress_at": _ts(b.in_progress_at), "expires_at": _ts(b.expires_at),
        "finalizing_at": _ts(b.finalizing_at), "completed_at": _ts(b.completed_at), "failed_at": _ts(b.failed_at),
        "expired_at": None, "cancelling_at": _ts(b.cancelling_at), "cancelled_at": _ts(b.cancelled_at),
        "request_counts": {"total": b.total, "completed": b.completed, "failed": b.failed},
        "metadata": b.metadata,
        # Kiln's own fields (clients ignore what they do not know)
        "usage": {"prompt_tokens": b.prompt_tokens, "completion_tokens": b.completion_tokens,
                  "total_tokens": b.prompt_tokens + b.completion_tokens},
        "kiln": {"concurrency": b.concurrency, "pacing_ms": b.pacing_ms, "reason": b.reason,
                 "deployment_id": b.deployment_id},
    }


def batch_progress(b) -> dict:
    """What the live page shows: counts, tokens, rate and ETA."""
    from django.utils import timezone

    finished = b.completed + b.failed
    remaining = max(0, b.total - finished)
    rate = eta = None
    if b.run_started and b.status in ("in_progress", "finalizing", "cancelling"):
        elapsed = (timezone.now() - b.run_started).total_seconds()
        done_now = finished - b.run_base
        if elapsed > 1 and done_now > 0:
            rate = done_now / elapsed
            eta = remaining / rate
    return {"id": b.id, "status": b.status, "reason": b.reason, "total": b.total, "completed": b.completed,
            "failed": b.failed, "remaining": remaining,
            "percent": round(100 * finished / b.total, 1) if b.total else 0,
            "prompt_tokens": b.prompt_tokens, "completion_tokens": b.completion_tokens,
            "rate": round(rate, 2) if rate else None, "eta_s": round(eta) if eta is not None else None,
            "finished": b.status in ("completed", "failed", "expired", "cancelled")}
