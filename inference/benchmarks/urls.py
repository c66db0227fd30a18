from django.urls import path

from inference.benchmarks import views

urlpatterns = [
    path("benchmarks/", views.benchmarks, name="benchmarks"),
    path("benchmarks/compare", views.benchmark_compare, name="benchmark_compare"),
    path("benchmarks/import", views.benchmark_import_page, name="benchmark_import"),
    path("benchmarks/<int:run_id>/", views.benchmark_detail, name="benchmark_detail"),
]
