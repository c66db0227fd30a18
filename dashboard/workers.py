"""The gunicorn worker class for the web process: uvicorn, without
permessage-deflate on websockets.

Every open tab gets the monitor's ~8 KB sample once a second; compressing it
separately for each tab was the largest share of the web process's cost per
sample and doubled the sample-to-browser p99 with 50 tabs
(bench/monitoring.py). On a LAN the saved bytes are worth less than the CPU.
"""
from uvicorn_worker import UvicornWorker as _UvicornWorker


class UvicornWorker(_UvicornWorker):
    CONFIG_KWARGS = {**_UvicornWorker.CONFIG_KWARGS, "ws_per_message_deflate": False}
