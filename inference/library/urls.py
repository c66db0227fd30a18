from django.urls import path

from inference.library import views

urlpatterns = [
    path("models/", views.models_page, name="models"),
    path("models/<int:artifact_id>/", views.model_detail_page, name="model_detail"),
]
