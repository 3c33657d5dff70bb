#!/usr/bin/env bash
# Fetches Apache Kafka's broker and tools (KRaft mode, no ZooKeeper) from Maven Central once,
# with every jar they need, into a cache outside the checkout, and prints the folder of jars:
#   java -cp "<that folder>/*" kafka.Kafka server.properties
# KAFKA_VERSION (default 4.4.0) picks the version; KAFKA_CACHE (default ~/.cache/ehb) the cache.
# Maven resolves the dependencies (scripts/install-test-deps.sh installs it and a Java runtime).
set -euo pipefail
version=${KAFKA_VERSION:-4.4.0}
cache=${KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ehb}
libs="$cache/kafka-$version/libs"
if [ -f "$libs/.complete" ]; then
  echo "$libs"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# kafka_2.13 is the broker; kafka-tools the admin commands the tests run (topics, consumer
# groups, transactions); log4j's SLF4J binding so the broker logs.
cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>ehb.local</groupId><artifactId>kafka-fetch</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$version</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$version</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>2.24.3</version></dependency>
  </dependencies>
</project>
POM
echo "fetching Apache Kafka $version from Maven Central into $libs" >&2
# Fetched beside the cache and moved into place whole: a fetch cut short, or two at once, never
# leaves a folder that looks complete.
mkdir -p "$(dirname "$libs")"
staging=$(mktemp -d "$libs.XXXXXX")
mvn -q -B -f "$work/pom.xml" dependency:copy-dependencies -DoutputDirectory="$staging" -DincludeScope=runtime >&2
[ -f "$staging/kafka_2.13-$version.jar" ] || { rm -rf "$staging"; echo "kafka_2.13-$version.jar was not fetched" >&2; exit 1; }
touch "$staging/.complete"
if [ -f "$libs/.complete" ]; then
  rm -rf "$staging"
else
  rm -rf "$libs"
  mv "$staging" "$libs"
fi
echo "$libs"
