import re


def camel_to_snake(name):
    """'parseHttpResponse' -> 'parse_http_response'."""
    return re.sub(r"(?=[A-Z])", "_", name).lower()
