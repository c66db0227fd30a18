from django.urls import path

from inference.benchmarks import views

urlpatterns = [
    path("benchmarks/", views.benchmarks, name="benchmarks"),
    path("benchmarks/compare", views.benchmark_compare, name="benchmark_compare"),
    path("benchmarks/import", views.benchmark_import_page, name="benchmark_import"),
    path("benchmarks/<int:run_id>/", views.benchmark_detail, name="benchmark_detail"),
    path("benchmarks/experiments/", views.experiments_page, name="experiments"),
    path("benchmarks/experiments/preset", views.experiment_preset, name="experiment_preset"),
    path("benchmarks/experiments/<int:experiment_id>/", views.experiment_detail, name="experiment_detail"),
    path("benchmarks/experiments/<int:experiment_id>/progress", views.experiment_progress,
         name="experiment_progress"),
    path("benchmarks/experiments/<int:experiment_id>/cancel", views.experiment_cancel, name="experiment_cancel"),
    path("benchmarks/experiments/<int:experiment_id>/resume", views.experiment_resume, name="experiment_resume"),
    path("benchmarks/experiments/<int:experiment_id>/report.html", views.experiment_report,
         name="experiment_report"),
    path("benchmarks/experiments/<int:experiment_id>/results.jsonl", views.experiment_results,
         name="experiment_results"),
]
