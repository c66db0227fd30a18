from django.urls import include, path

from inference import benchmark_views, views

urlpatterns = [
    path("models/", views.models_page, name="models"),
    path("models/<int:artifact_id>/", views.model_detail_page, name="model_detail"),
    path("api/models/", views.api_models, name="api_models"),
    path("api/models/preview", views.api_model_preview, name="api_model_preview"),
    path("api/models/import", views.api_model_import, name="api_model_import"),
    path("api/models/<int:artifact_id>", views.api_model, name="api_model"),
    path("api/models/<int:artifact_id>/<str:action>", views.api_model_action, name="api_model_action"),
    path("", include("inference.deployment_urls")),
    path("benchmarks/", benchmark_views.benchmarks, name="benchmarks"),
    path("benchmarks/compare", benchmark_views.benchmark_compare, name="benchmark_compare"),
    path("benchmarks/import", benchmark_views.benchmark_import_page, name="benchmark_import"),
    path("benchmarks/<int:run_id>/", benchmark_views.benchmark_detail, name="benchmark_detail"),
    path("api/benchmarks/", benchmark_views.api_benchmarks, name="api_benchmarks"),
    path("api/benchmarks/compare", benchmark_views.api_benchmarks_compare, name="api_benchmarks_compare"),
    path("api/benchmarks/import", benchmark_views.api_benchmark_import, name="api_benchmark_import"),
    path("api/benchmarks/<int:run_id>", benchmark_views.api_benchmark, name="api_benchmark"),
    path("api/benchmarks/<int:run_id>/cancel", benchmark_views.api_benchmark_cancel, name="api_benchmark_cancel"),
    path("api/benchmarks/<int:run_id>/export", benchmark_views.api_benchmark_export, name="api_benchmark_export"),
]
