"""The test settings with LOCALE_PATHS pointed at a scratch folder, so that
makemessages can extract the sources' messages without touching locale/."""
import os
from pathlib import Path

from tests.settings import *  # noqa: F401,F403

LOCALE_PATHS = [Path(os.environ["KILN_EXTRACT_TO"])]
