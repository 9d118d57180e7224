#!/usr/bin/env bash
# The compose stack's Spark Connect server: a pre-shared token, and TLS in front of it.
#
#   spark-connect.sh secrets                        (service spark-connect-secrets, as root, one shot)
#   spark-connect.sh serve spark-submit ARGS...     (service spark-connect)
#
# secrets: in $KBP_SPARK_CONNECT_SECRETS (the spark-connect-secrets volume), kept once made:
#   token              the server's pre-shared token (Spark's SPARK_CONNECT_AUTHENTICATE_TOKEN);
#                      airflow-init copies it into the spark_connect_default connection's password
#   tls.key, tls.crt   the TLS proxy's key and certificate for the name spark-connect, signed by the
#                      stack's CA (kafka-tls: $KBP_TLS_CA_DIR/ca.pem, ca-key.pem), so the clients
#                      that trust that CA (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) accept it; made again
#                      when it no longer verifies against that CA (a new kafka-tls volume, expiry)
#   All three belong to uid 50000 (the image's airflow user), mode 0600.
#
# serve: nginx (Debian's) listens on $KBP_SPARK_CONNECT_LISTEN (spark-connect:15002) with TLS and
#   HTTP/2 and passes gRPC to the Connect server on $KBP_SPARK_CONNECT_BACKEND (127.0.0.1:15012, the
#   container's loopback: the compose file binds the server there). The token reaches the server in
#   its environment only (not its command line, not its configuration, so not its UI); nginx never
#   sees it. Both run until either exits, then the other is stopped and the container exits
#   (compose restarts it).
set -euo pipefail
log() { echo "spark-connect: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
SECRETS="${KBP_SPARK_CONNECT_SECRETS:-/opt/kbp/spark-connect}"
tmp="" nginx_pid="" spark_pid=""   # global: the traps use them
NAME="${KBP_SPARK_CONNECT_TLS_NAME:-spark-connect}"

secrets() {
    local ca="${KBP_TLS_CA_DIR:-/etc/kafka/tls}" owner="${KBP_SPARK_CONNECT_UID:-50000}"
    [[ -d "$SECRETS" ]] || die "$SECRETS is not a directory (mount the spark-connect-secrets volume there)"
    umask 077
    tmp="$(mktemp -d "$SECRETS/.new.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    if [[ -s "$SECRETS/token" ]]; then
        log "token kept ($SECRETS/token)"
    else
        python3 -c 'import secrets, sys; sys.stdout.write(secrets.token_urlsafe(32))' > "$tmp/token"
        mv "$tmp/token" "$SECRETS/token"
        log "token generated ($SECRETS/token)"
    fi
    if [[ -s "$SECRETS/tls.key" ]] && openssl verify -CAfile "$ca/ca.pem" -purpose sslserver \
        -verify_hostname "$NAME" "$SECRETS/tls.crt" > /dev/null 2>&1; then
        log "TLS certificate for $NAME kept ($SECRETS/tls.crt)"
    else
        [[ -s "$ca/ca.pem" && -s "$ca/ca-key.pem" ]] \
            || die "no CA in $ca (ca.pem and ca-key.pem, made by the kafka-tls service): run kafka-tls first, or remove its volume if an older version made it without ca-key.pem"
        printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
            "extendedKeyUsage=serverAuth" "subjectAltName=DNS:$NAME" > "$tmp/ext"
        openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$NAME" \
            -keyout "$tmp/tls.key" -out "$tmp/tls.csr" 2> "$tmp/err" || { cat "$tmp/err" >&2; die "openssl req failed"; }
        openssl x509 -req -in "$tmp/tls.csr" -CA "$ca/ca.pem" -CAkey "$ca/ca-key.pem" \
            -set_serial "0x$(openssl rand -hex 16)" -days "${KBP_SPARK_CONNECT_TLS_DAYS:-365}" \
            -extfile "$tmp/ext" -out "$tmp/tls.crt" 2> "$tmp/err" || { cat "$tmp/err" >&2; die "openssl x509 failed"; }
        cat "$ca/ca.pem" >> "$tmp/tls.crt"  # the chain nginx sends
        mv "$tmp/tls.key" "$SECRETS/tls.key"
        mv "$tmp/tls.crt" "$SECRETS/tls.crt"
        log "TLS certificate for $NAME signed by $ca/ca.pem ($SECRETS/tls.crt)"
    fi
    chown "$owner:0" "$SECRETS" "$SECRETS/token" "$SECRETS/tls.key" "$SECRETS/tls.crt"
    chmod 0700 "$SECRETS"
    chmod 0600 "$SECRETS/token" "$SECRETS/tls.key" "$SECRETS/tls.crt"
}

serve() {
    local listen="${KBP_SPARK_CONNECT_LISTEN:?set KBP_SPARK_CONNECT_LISTEN (host:port of the TLS proxy)}"
    local backend="${KBP_SPARK_CONNECT_BACKEND:?set KBP_SPARK_CONNECT_BACKEND (127.0.0.1:port of the Connect server)}"
    local f run rc
    [[ $# -gt 0 ]] || die "serve: give the Connect server's command (spark-submit ...)"
    for f in token tls.key tls.crt; do
        [[ -s "$SECRETS/$f" ]] || die "$SECRETS/$f is missing (made by the spark-connect-secrets service)"
    done
    run="$(mktemp -d /tmp/kbp-nginx.XXXXXX)"
    # client_max_body_size 0: a plan or an artifact may exceed nginx's default 1 MB request;
    # read/send timeouts longer than Spark Connect's reattachable streams (2 min each)
    cat > "$run/nginx.conf" <<EOF
worker_processes 1;
pid $run/nginx.pid;
error_log stderr warn;
events { worker_connections 512; }
http {
    access_log off;
    client_body_temp_path $run/body;
    proxy_temp_path $run/proxy;
    fastcgi_temp_path $run/fastcgi;
    uwsgi_temp_path $run/uwsgi;
    scgi_temp_path $run/scgi;
    server {
        listen $listen ssl http2;
        ssl_certificate $SECRETS/tls.crt;
        ssl_certificate_key $SECRETS/tls.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        client_max_body_size 0;
        keepalive_requests 100000;
        grpc_read_timeout 10m;
        grpc_send_timeout 10m;
        location / {
            grpc_pass grpc://$backend;
        }
    }
}
EOF
    trap 'kill -TERM $nginx_pid $spark_pid 2> /dev/null || true' TERM INT
    nginx -e stderr -c "$run/nginx.conf" -g 'daemon off;' &
    nginx_pid=$!
    log "TLS proxy (nginx) on $listen -> grpc://$backend"
    IFS= read -r SPARK_CONNECT_AUTHENTICATE_TOKEN < "$SECRETS/token" || true
    [[ -n "$SPARK_CONNECT_AUTHENTICATE_TOKEN" ]] || die "$SECRETS/token is empty"
    export SPARK_CONNECT_AUTHENTICATE_TOKEN
    "$@" &
    spark_pid=$!
    unset SPARK_CONNECT_AUTHENTICATE_TOKEN
    rc=0
    wait -n "$nginx_pid" "$spark_pid" || rc=$?
    if ! kill -0 "$nginx_pid" 2> /dev/null; then
        log "the TLS proxy exited (status $rc): stopping the Connect server"
    elif ! kill -0 "$spark_pid" 2> /dev/null; then
        log "the Connect server exited (status $rc): stopping the TLS proxy"
    fi
    kill -TERM "$nginx_pid" "$spark_pid" 2> /dev/null || true
    wait "$nginx_pid" "$spark_pid" 2> /dev/null || true
    exit $((rc == 0 ? 1 : rc))
}

case "${1:-}" in
    secrets) shift; secrets "$@" ;;
    serve) shift; serve "$@" ;;
    *) die "usage: spark-connect.sh secrets | serve spark-submit ARGS..." ;;
esac
