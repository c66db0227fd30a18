from django.urls import path

from inference.batches import views

urlpatterns = [
    path("batches/", views.batch_list, name="batches"),
    path("batches/new", views.batch_new, name="batch_new"),
    path("batches/<str:batch_id>/", views.batch_detail, name="batch_detail"),
    path("batches/<str:batch_id>/progress", views.batch_progress, name="batch_progress"),
    path("batches/<str:batch_id>/cancel", views.batch_cancel, name="batch_cancel"),
    path("batches/<str:batch_id>/resume", views.batch_resume, name="batch_resume"),
    path("batches/<str:batch_id>/download/<str:which>", views.batch_download, name="batch_download"),
]
