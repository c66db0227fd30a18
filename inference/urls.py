from django.urls import path

from dashboard.views import section

urlpatterns = [
    path(
        "models/",
        section,
        {"title": "Models", "blurb": "Download models from Hugging Face or ModelScope, verified by sha256, or import a local folder."},
        name="models",
    ),
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
