from django.urls import path

from inference.deployments import views as v

urlpatterns = [
    path("deployments/", v.deployments, name="deployments"),
    path("deployments/<int:deployment_id>/", v.deployment_detail, name="deployment_detail"),
    path("deployments/<int:deployment_id>/stop", v.deployment_stop, name="deployment_stop"),
    path("deployments/<int:deployment_id>/restart", v.deployment_restart, name="deployment_restart"),
    path("deployments/<int:deployment_id>/relaunch-max-len", v.deployment_relaunch_max_len,
         name="deployment_relaunch_max_len"),
    path("deployments/presets/<slug:slug>/launch", v.preset_launch, name="preset_launch"),
    path("deployments/profiles/new", v.profile_edit, name="profile_new"),
    path("deployments/profiles/<int:profile_id>/", v.profile_edit, name="profile_edit"),
    path("deployments/profiles/<int:profile_id>/launch", v.profile_launch, name="profile_launch"),
    path("deployments/runtimes/", v.runtimes, name="runtimes"),
    path("deployments/runtimes/install", v.runtime_install, name="runtime_install"),
    path("deployments/runtimes/<int:runtime_id>/uninstall", v.runtime_uninstall, name="runtime_uninstall"),
    path("deployments/runtimes/new", v.runtime_create, name="runtime_create"),
    path("deployments/runtimes/<int:runtime_id>/detect", v.runtime_detect, name="runtime_detect"),
]
