def deep_merge(base, override):
    """A new dict: `override` wins, nested dicts are merged recursively."""
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(value, result[key])
        else:
            result[key] = value
    return result
