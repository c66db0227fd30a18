from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Kiln"

    def ready(self):
        from dashboard import audit

        audit.connect_signals()

        from django.contrib.auth.signals import user_logged_in

        from dashboard.middleware import keep_language_chosen_before_sign_in

        user_logged_in.connect(keep_language_chosen_before_sign_in, dispatch_uid="kiln_language_at_sign_in")
