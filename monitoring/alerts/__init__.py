"""Alerts: tell the team when something breaks, in the chat tools they use.

- events.py: ``raise_event`` (the one public entry: the monitor, the watch
  loop, library tasks and batch jobs call it) and the kinds of event.
- models.py: channels, rules, events (one open event per incident key) and one
  delivery row per channel, each a row the alerts page reads.
- channels.py: the message format and signature of each platform.
- delivery.py: claim, send, record, retry with backoff.
- checks.py: the conditions that need state across samples (thermal for N s,
  unhealthy for N s) and the host checks (disk, worker, silent monitors).
- crypto.py: secrets encrypted at rest (Fernet, key derived from SECRET_KEY).
"""
