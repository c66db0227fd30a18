from django.urls import path

from inference.benchmarks import views

urlpatterns = [
    path("benchmarks/", views.benchmarks, name="benchmarks"),
    path("benchmarks/compare", views.benchmark_compare, name="benchmark_compare"),
    path("benchmarks/import", views.benchmark_import_page, name="benchmark_import"),
    path("benchmarks/<int:run_id>/", views.benchmark_detail, name="benchmark_detail"),
    path("api/benchmarks/", views.api_benchmarks, name="api_benchmarks"),
    path("api/benchmarks/compare", views.api_benchmarks_compare, name="api_benchmarks_compare"),
    path("api/benchmarks/import", views.api_benchmark_import, name="api_benchmark_import"),
    path("api/benchmarks/<int:run_id>", views.api_benchmark, name="api_benchmark"),
    path("api/benchmarks/<int:run_id>/cancel", views.api_benchmark_cancel, name="api_benchmark_cancel"),
    path("api/benchmarks/<int:run_id>/export", views.api_benchmark_export, name="api_benchmark_export"),
]
