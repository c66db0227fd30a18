from django.urls import include, path

from dashboard.views import section

urlpatterns = [
    path(
        "models/",
        section,
        {"title": "Models", "blurb": "Download models from Hugging Face or ModelScope, verified by sha256, or import a local folder."},
        name="models",
    ),
    path("", include("inference.deployment_urls")),
    path(
        "benchmarks/",
        section,
        {"title": "Benchmarks", "blurb": "Run benchmarks comparable with vllm bench serve and compare configurations side by side."},
        name="benchmarks",
    ),
]
