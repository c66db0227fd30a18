from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Kiln"

    def ready(self):
        from dashboard import audit

        audit.connect_signals()
