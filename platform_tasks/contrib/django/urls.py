"""URLs of the standalone console: the admin at the root."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from django.views.generic.base import RedirectView

admin.site.site_header = "Platform operations console"
admin.site.site_title = "Platform console"
admin.site.index_title = "Operations"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
