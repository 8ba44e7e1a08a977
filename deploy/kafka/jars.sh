#!/bin/sh
# The jars of a Kafka broker with Aiven's tiered storage plugin, resolved by Maven from the POMs beside
# this script and kept in a cache folder outside the repository:
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tsproxy/kafka/<hash of the POMs and this script>/broker/*.jar
#                                                                                 /plugin/*.jar
#
# A folder that is complete is reused as it is (Maven's own downloads stay in ~/.m2). Usage:
#
#   deploy/kafka/jars.sh          build the folder if it is not there yet; print its path
#   deploy/kafka/jars.sh --dir    print the path only (the tests use it to find the jars)
#
# The plugin: the published io.aiven jars (maven/plugin/pom.xml) when Maven resolves them; otherwise the
# plugin's release distribution as its project ships it (its core and s3 archives unpacked into one folder
# of jars), looked for at $AIVEN_TS_PLUGIN_DIR, then <cache>/tsproxy/kafka/dist/tiered-storage-for-apache-kafka-1.0.0.
# Without either the broker is still installed and the plugin folder is left out: the broker tests then
# skip, saying so.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/tsproxy/kafka"
release=tiered-storage-for-apache-kafka-1.0.0
hash=$(cat "$here/jars.sh" "$here/maven/broker/pom.xml" "$here/maven/plugin/pom.xml" | sha256sum | cut -c1-16)
dir="$cache_root/$hash"

if [ "${1:-}" = "--dir" ]; then
  echo "$dir"
  exit 0
fi
if [ -f "$dir/.complete" ]; then
  echo "$dir"
  exit 0
fi

if ! command -v mvn >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends maven default-jdk-headless >/dev/null
fi

work="$dir.partial.$$"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
mvn_quiet() { mvn -B -q "$@" >"$work/mvn.log" 2>&1 || { tail -40 "$work/mvn.log" >&2; return 1; }; }

mvn_quiet -f "$here/maven/broker/pom.xml" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$work/broker"

plugin=yes
if mvn -B -q -f "$here/maven/plugin/pom.xml" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$work/plugin" >"$work/plugin-mvn.log" 2>&1; then
  echo "kafka-jars: Aiven's plugin from its published jars" >&2
else
  rm -rf "$work/plugin"
  dist="${AIVEN_TS_PLUGIN_DIR:-$cache_root/dist/$release}"
  if ls "$dist"/*.jar >/dev/null 2>&1; then
    echo "kafka-jars: Aiven's plugin from its distribution at $dist" >&2
    mkdir -p "$work/plugin"
    cp "$dist"/*.jar "$work/plugin/"
  else
    echo "kafka-jars: Aiven's plugin is not served by the Maven repository here and no distribution was found" >&2
    echo "kafka-jars: (unpack its release into $cache_root/dist/$release or set AIVEN_TS_PLUGIN_DIR); broker tests will skip" >&2
    plugin=no
  fi
fi

if [ "$plugin" = yes ]; then
  # Kafka loads the plugin child first: a copy of Kafka's own classes or of SLF4J/a logging binding here
  # would shadow the broker's and break it (the plugin folder must hold neither).
  for jar in "$work"/plugin/*.jar; do
    if unzip -Z1 "$jar" | grep -q -E '^(org/apache/kafka/|org/slf4j/|org/apache/logging/|ch/qos/|org/apache/log4j/)'; then
      echo "kafka-jars: $(basename "$jar") holds Kafka, SLF4J or logging classes; refusing" >&2
      exit 1
    fi
  done
fi

rm -f "$work/mvn.log" "$work/plugin-mvn.log"
rm -rf "$dir"
mv "$work" "$dir"
trap - EXIT
touch "$dir/.complete"
echo "$dir"
