from django.urls import path

from inference.deployments import views as v

urlpatterns = [
    path("deployments/", v.deployments, name="deployments"),
    path("deployments/<int:deployment_id>/", v.deployment_detail, name="deployment_detail"),
    path("deployments/<int:deployment_id>/stop", v.deployment_stop, name="deployment_stop"),
    path("deployments/<int:deployment_id>/restart", v.deployment_restart, name="deployment_restart"),
    path("deployments/presets/<slug:slug>/launch", v.preset_launch, name="preset_launch"),
    path("deployments/profiles/new", v.profile_edit, name="profile_new"),
    path("deployments/profiles/<int:profile_id>/", v.profile_edit, name="profile_edit"),
    path("deployments/profiles/<int:profile_id>/launch", v.profile_launch, name="profile_launch"),
    path("deployments/runtimes/new", v.runtime_create, name="runtime_create"),
    path("deployments/runtimes/<int:runtime_id>/detect", v.runtime_detect, name="runtime_detect"),
    path("api/deployments/", v.api_deployments, name="api_deployments"),
    path("api/deployments/<int:deployment_id>", v.api_deployment, name="api_deployment"),
    path("api/deployments/<int:deployment_id>/stop", v.api_deployment_stop, name="api_deployment_stop"),
    path("api/deployments/<int:deployment_id>/restart", v.api_deployment_restart, name="api_deployment_restart"),
    path("api/launch-profiles/preview", v.api_profile_preview, name="api_profile_preview"),
    path("api/runtimes/", v.api_runtimes, name="api_runtimes"),
    path("api/runtimes/<int:runtime_id>", v.api_runtime, name="api_runtime"),
]
