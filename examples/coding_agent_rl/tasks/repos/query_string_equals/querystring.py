def parse_query(query):
    """'a=1&b=2' -> {'a': '1', 'b': '2'}; only the first '=' separates key and value."""
    params = {}
    for pair in query.split("&"):
        if not pair:
            continue
        key, value = pair.split("=")
        params[key] = value
    return params
