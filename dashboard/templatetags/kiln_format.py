"""Numbers and sizes in the page's language.

    {% load kiln_format %}
    {{ artifact.bytes_total|binarysize }}   -> "12.5 GiB" (binary units, as the engines and the JS print them)
    {{ tokens|grouped }}                    -> "1,234,567" (the language's grouping)
    {{ rate|grouped:1 }}                    -> "1,234.5"

Django's filesizeformat counts in 1024s but writes "GB"; the monitoring and
preflight scripts write "GiB". One spelling everywhere.
"""
from django import template
from django.utils.formats import number_format

register = template.Library()

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


@register.filter
def binarysize(value):
    try:
        size = float(value)
    except (TypeError, ValueError):
        return ""
    unit = 0
    while abs(size) >= 1024 and unit < len(UNITS) - 1:
        size /= 1024
        unit += 1
    digits = 0 if unit == 0 else (2 if abs(size) < 10 else 1)
    return f"{number_format(round(size, digits), digits, use_l10n=True, force_grouping=True)} {UNITS[unit]}"


@register.filter
def grouped(value, digits=0):
    """A number with the language's thousands separator and decimal sign."""
    try:
        number = float(value)
        digits = int(digits)
    except (TypeError, ValueError):
        return value
    return number_format(round(number, digits), digits, use_l10n=True, force_grouping=True)
