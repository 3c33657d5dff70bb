# Config files for the drain benchmarks (bench-drain.sh, bench-impaired.sh), sourced by them:
# a cloud-bridge on the JetStream sink and an edge-node draining a pre-filled spool to it, both
# with the development PKI in CERTS.

# cloud_config FILE QUIC_BIND HTTP_BIND NATS_URL CERTS (SINK=kafka: NATS_URL is the bootstrap)
cloud_config() {
  cat > "$1" << EOC
[server]
bind = "$2"
cert = "$5/cloud.pem"
key = "$5/cloud.key"
client_ca = "$5/fleet-ca.pem"
[http]
bind = "$3"
$(if [ "${SINK:-jetstream}" = sqlite ]; then
  printf '[sink]\nkind = "sqlite"\npath = "%s"\n' "$1.db"
elif [ "${SINK:-jetstream}" = kafka ]; then
  printf '[sink]\nkind = "kafka"\nbootstrap = "%s"\n' "$4"
else
  printf '[sink]\nkind = "jetstream"\nurl = "%s"\nbatches = "%s"\n' "$4" "${BATCHES:-auto}"
fi)
[log]
level = "${LOGLEVEL:-warn}"
EOC
}

# edge_config FILE SPOOL BRIDGE_ADDR CERTS; BATCH_RECORDS and WINDOW override the uplink's
# defaults.
edge_config() {
  cat > "$1" << EOC
node_id = "bench-edge"
[log]
level = "${LOGLEVEL:-warn}"
[http]
bind = "127.0.0.1:0"
[[listener]]
name = "local"
bind = "127.0.0.1:0"
anonymous = true
[spool]
path = "$2"
budget = "4 GiB"
[[class]]
name = "telemetry"
filters = ["telemetry/#"]
route = "central"
priority = 3
[uplink]
server = "$3"
server_name = "localhost"
ca = "$4/fleet-ca.pem"
cert = "$4/edge-edge-1.pem"
key = "$4/edge-edge-1.key"
$(if [ -n "${BATCH_RECORDS:-}" ]; then echo "batch_records = $BATCH_RECORDS"; fi)
$(if [ -n "${WINDOW:-}" ]; then echo "window = $WINDOW"; fi)
EOC
}
