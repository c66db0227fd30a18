# Kiln's Simplified Chinese formats (FORMAT_MODULE_PATH). Django's zh_Hans groups
# digits by 4 with no separator; Chinese engineers read GPU and token figures
# grouped by thousands with a comma (1,234,567), as vLLM's own logs print them.
DATE_FORMAT = "Y年n月j日"
DATETIME_FORMAT = "Y年n月j日 H:i"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
TIME_FORMAT = "H:i"
DECIMAL_SEPARATOR = "."
THOUSAND_SEPARATOR = ","
NUMBER_GROUPING = 3
