from django.urls import path

from inference.preflight import views as v

urlpatterns = [
    path("deployments/plan", v.plan, name="deployment_plan"),
]
