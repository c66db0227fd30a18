from django.urls import path

from dashboard.views import section
from inference import views

urlpatterns = [
    path("models/", views.models_page, name="models"),
    path("models/<int:artifact_id>/", views.model_detail_page, name="model_detail"),
    path("api/models/", views.api_models, name="api_models"),
    path("api/models/preview", views.api_model_preview, name="api_model_preview"),
    path("api/models/import", views.api_model_import, name="api_model_import"),
    path("api/models/<int:artifact_id>", views.api_model, name="api_model"),
    path("api/models/<int:artifact_id>/<str:action>", views.api_model_action, name="api_model_action"),
    path(
        "deployments/",
        section,
        {"title": "Deployments", "blurb": "Launch, watch and stop inference engines (vLLM, llama.cpp, SGLang)."},
        name="deployments",
    ),
    path(
        "benchmarks/",
        section,
        {"title": "Benchmarks", "blurb": "Run benchmarks comparable with vllm bench serve and compare configurations side by side."},
        name="benchmarks",
    ),
]
