"""Serve plotly.js from the plotly package at static/vendor/plotly.min.js.

The panels run without internet, so no CDN; the plotly wheel in requirements
already carries the exact file, so we don't commit a 4.8 MB copy of it.
"""
from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PACKAGE_DATA = Path(plotly.__file__).parent / "package_data"
PUBLIC_PATH = "vendor/plotly.min.js"


class PlotlyFinder(BaseFinder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=str(PACKAGE_DATA))
        self.storage.prefix = "vendor"

    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        if path != PUBLIC_PATH:
            return [] if find_all else None
        found = str(PACKAGE_DATA / "plotly.min.js")
        return [found] if find_all else found

    def list(self, ignore_patterns):
        yield "plotly.min.js", self.storage
