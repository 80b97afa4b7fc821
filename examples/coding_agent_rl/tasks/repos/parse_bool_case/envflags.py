TRUE_VALUES = {"1", "true", "yes", "on"}
FALSE_VALUES = {"0", "false", "no", "off", ""}


def parse_bool(raw):
    """Parse an environment flag; raises ValueError on anything unrecognized."""
    value = raw
    if value in TRUE_VALUES:
        return True
    if value in FALSE_VALUES:
        return False
    raise ValueError(f"not a boolean: {raw!r}")
