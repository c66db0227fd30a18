from django.urls import path

from monitoring import views

urlpatterns = [
    path("monitoring/", views.monitoring, name="monitoring"),
    path("monitoring/history", views.monitoring_history, name="monitoring_history"),
    path("monitoring/history.csv", views.monitoring_history_csv, name="monitoring_history_csv"),
]
