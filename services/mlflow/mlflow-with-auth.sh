#!/bin/sh
# Runs `mlflow "$@"` with MLflow's basic-auth app configured from the environment; the
# chart starts the server this way when mlflow.server.auth.enabled
# (charts/spanmill/templates/mlflow/deployment.yaml), and tests/registry/test_mlflow_auth.py
# starts it the same way.
#
#   MLFLOW_AUTH_DATABASE_URI    the users' database (beside the backend store; it may hold
#                               a database password, so it comes from a Secret)
#   MLFLOW_AUTH_DEFAULT_PERMISSION  what a signed-in user gets without a grant (READ)
#   MLFLOW_AUTH_ADMIN_USERNAME, MLFLOW_AUTH_ADMIN_PASSWORD  read by MLflow itself; the
#                               password counts only when the admin is first created
#
# The ini MLflow reads (MLFLOW_AUTH_CONFIG_PATH) is written under /tmp at each start and
# readable by this user alone, so no credential is ever in a ConfigMap or an argument.
set -eu

: "${MLFLOW_AUTH_DATABASE_URI:?set MLFLOW_AUTH_DATABASE_URI to the database of MLflow users}"
: "${MLFLOW_AUTH_ADMIN_USERNAME:?set MLFLOW_AUTH_ADMIN_USERNAME (the admin Secret)}"
: "${MLFLOW_AUTH_ADMIN_PASSWORD:?set MLFLOW_AUTH_ADMIN_PASSWORD (the admin Secret)}"
permission="${MLFLOW_AUTH_DEFAULT_PERMISSION:-READ}"
case "$permission" in
  READ | USE | EDIT | MANAGE | NO_PERMISSIONS) ;;
  *) echo "MLFLOW_AUTH_DEFAULT_PERMISSION=$permission: one of READ, USE, EDIT, MANAGE, NO_PERMISSIONS" >&2; exit 2 ;;
esac

config_dir="${TMPDIR:-/tmp}/mlflow-auth"
umask 077
mkdir -p "$config_dir"
# configparser reads % as interpolation: a URL-encoded password needs it doubled.
database_uri=$(printf '%s' "$MLFLOW_AUTH_DATABASE_URI" | sed 's/%/%%/g')
cat > "$config_dir/basic_auth.ini" <<INI
[mlflow]
default_permission = $permission
database_uri = $database_uri
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
INI
export MLFLOW_AUTH_CONFIG_PATH="$config_dir/basic_auth.ini"
unset MLFLOW_AUTH_DATABASE_URI

# The key of the auth app's CSRF tokens (its login forms): a new one at each start, so
# one replica serves them; it is never stored.
if [ -z "${MLFLOW_FLASK_SERVER_SECRET_KEY:-}" ]; then
  MLFLOW_FLASK_SERVER_SECRET_KEY=$(python -c 'import secrets; print(secrets.token_hex(32))')
  export MLFLOW_FLASK_SERVER_SECRET_KEY
fi

exec mlflow "$@"
