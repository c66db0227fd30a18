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
