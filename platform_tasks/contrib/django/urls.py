"""URLs of the standalone console: the admin at the root."""

from __future__ import annotations

from django.contrib import admin  # type: ignore[import-untyped]
from django.urls import path  # type: ignore[import-untyped]
from django.views.generic.base import RedirectView  # type: ignore[import-untyped]

admin.site.site_header = "Platform operations console"
admin.site.site_title = "Platform console"
admin.site.index_title = "Operations"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
