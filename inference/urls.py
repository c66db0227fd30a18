"""Every page and API route of the inference app, one include per area."""
from django.urls import include, path

urlpatterns = [
    path("", include("inference.preflight.urls")),
    path("", include("inference.library.urls")),
    path("", include("inference.deployments.urls")),
    path("", include("inference.benchmarks.urls")),
    path("", include("inference.batches.urls")),
]
