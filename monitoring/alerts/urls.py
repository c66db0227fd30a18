from django.urls import path

from monitoring.alerts import views

urlpatterns = [
    path("alerts/", views.alerts_page, name="alerts"),
    path("alerts/channels/new", views.channel_edit, name="alert_channel_new"),
    path("alerts/channels/<int:channel_id>/", views.channel_edit, name="alert_channel_edit"),
    path("alerts/channels/<int:channel_id>/test", views.channel_test, name="alert_channel_test"),
    path("alerts/channels/<int:channel_id>/delete", views.channel_delete, name="alert_channel_delete"),
    path("alerts/rules/new", views.rule_edit, name="alert_rule_new"),
    path("alerts/rules/<int:rule_id>/", views.rule_edit, name="alert_rule_edit"),
    path("alerts/rules/<int:rule_id>/delete", views.rule_delete, name="alert_rule_delete"),
]
