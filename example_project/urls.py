"""URLs of the example project: the admin shows jobs, open windows, dead letters and doc builds."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
