#!/bin/sh
# Temporal's two databases on the compose file's PostgreSQL, created or upgraded to the schema of
# the admin-tools image's release (docker-compose.yml's temporal-schema service runs it before the
# server starts). Every step is safe to repeat: `create` skips a database that exists, and
# `setup-schema`/`update-schema` move a schema only forward.
set -eu
sql() { temporal-sql-tool --plugin postgres12 --ep postgres -p 5432 -u "$POSTGRES_USER" "$@"; }  # SQL_PASSWORD
schema() {  # database, schema directory
  sql --db "$1" create
  sql --db "$1" setup-schema -v 0.0
  sql --db "$1" update-schema -d "/etc/temporal/schema/postgresql/v12/$2/versioned"
}
schema temporal temporal
schema temporal_visibility visibility
echo "temporal-schema: databases temporal and temporal_visibility are up to date"
