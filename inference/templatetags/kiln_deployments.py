"""Template filters for the deployments pages."""
from django import template

from inference.deployments import phases

register = template.Library()


@register.filter
def phase_label(phase):
    """A deployment phase code ("loading_weights") as the reader reads it."""
    return phases.label(phase)
