from django.urls import path

from inference.gateway import views

urlpatterns = [
    path("v1/chat/completions", views.chat_completions, name="gateway_chat"),
    path("v1/completions", views.completions, name="gateway_completions"),
    path("v1/embeddings", views.embeddings, name="gateway_embeddings"),
    path("v1/models", views.models, name="gateway_models"),
    path("keys/", views.keys_page, name="gateway_keys"),
    path("keys/new", views.key_create, name="gateway_key_create"),
    path("keys/<int:key_id>/revoke", views.key_revoke, name="gateway_key_revoke"),
    path("playground/", views.playground, name="playground"),
]

# Batch jobs (OpenAI's Files and Batches APIs): the views live in inference/batches/v1.py.
from inference.batches import v1 as batches_v1  # noqa: E402

urlpatterns += [
    path("v1/files", batches_v1.files, name="gateway_files"),
    path("v1/files/<str:file_id>", batches_v1.file_detail, name="gateway_file"),
    path("v1/files/<str:file_id>/content", batches_v1.file_content, name="gateway_file_content"),
    path("v1/batches", batches_v1.batches, name="gateway_batches"),
    path("v1/batches/<str:batch_id>", batches_v1.batch_detail, name="gateway_batch"),
    path("v1/batches/<str:batch_id>/cancel", batches_v1.batch_cancel, name="gateway_batch_cancel"),
]
