from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.urls import include, path
from django.views.i18n import JavaScriptCatalog

from dashboard import views
from dashboard.api import api
from dashboard.api_routes import api as dashboard_api
from inference.benchmarks.api import api as benchmarks_api
from inference.deployments.api import api as deployments_api
from inference.library.api import api as library_api
from inference.preflight.api import api as preflight_api

api.add_router("", dashboard_api)
api.add_router("", library_api)
api.add_router("", deployments_api)
api.add_router("", preflight_api)
api.add_router("", benchmarks_api)

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("login/", views.LoginView.as_view(), name="login"),
    # Translations for the pages' JS (gettext, ngettext, interpolate); the sign-in page needs them too.
    path("jsi18n/", login_not_required(JavaScriptCatalog.as_view()), name="javascript-catalog"),
    path("language/", views.set_language, name="set_language"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/", views.PasswordChangeView.as_view(), name="password_change"),
    path("users/", views.users, name="users"),
    path("users/new", views.user_create, name="user_create"),
    path("users/<int:user_id>/role", views.user_role, name="user_role"),
    path("users/<int:user_id>/reset-password", views.user_reset_password, name="user_reset_password"),
    path("users/<int:user_id>/end-sessions", views.user_end_sessions, name="user_end_sessions"),
    path("users/<int:user_id>/active", views.user_active, name="user_active"),
    path("users/<int:user_id>/delete", views.user_delete, name="user_delete"),
    path("settings/hub", views.hub_preference, name="hub_preference"),
    path("audit/", views.audit_page, name="audit"),
    path("audit.csv", views.audit_csv, name="audit_csv"),
    path("api/", api.urls),
    path("", include("inference.urls")),
    path("", include("monitoring.urls")),
    path("", include("monitoring.alerts.urls")),
    path("", include("inference.gateway.urls")),
]

handler403 = "dashboard.errors.forbidden"
handler404 = "dashboard.errors.not_found"
handler500 = "dashboard.errors.server_error"
