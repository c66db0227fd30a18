from django.urls import path

from monitoring import views

urlpatterns = [
    path("monitoring/", views.monitoring, name="monitoring"),
]
