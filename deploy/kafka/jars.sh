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
# same release compiled from its source tarball (maven/plugin-source/pom.xml), looked for at
# $AIVEN_TS_SOURCE, then <cache>/tsproxy/kafka/src/tiered-storage-for-apache-kafka-1.0.0.tar.gz (a
# directory of that name without .tar.gz works too). Without either the broker is still installed and the
# plugin folder is left out: the broker tests then skip, saying so.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/tsproxy/kafka"
release=tiered-storage-for-apache-kafka-1.0.0
hash=$(cat "$here/jars.sh" "$here/maven/broker/pom.xml" "$here/maven/plugin/pom.xml" \
  "$here/maven/plugin-source/pom.xml" | sha256sum | cut -c1-16)
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
  source="${AIVEN_TS_SOURCE:-}"
  if [ -z "$source" ]; then
    for candidate in "$cache_root/src/$release" "$cache_root/src/$release.tar.gz"; do
      if [ -e "$candidate" ]; then source=$candidate; break; fi
    done
  fi
  if [ -z "$source" ]; then
    echo "kafka-jars: Aiven's plugin is not served by the Maven repository here and no source was found" >&2
    echo "kafka-jars: (set AIVEN_TS_SOURCE or put $release.tar.gz in $cache_root/src); broker tests will skip" >&2
    plugin=no
  else
    if [ -d "$source" ]; then
      tree=$source
    else
      mkdir -p "$work/src"
      tar -xzf "$source" -C "$work/src"
      tree="$work/src/$release"
    fi
    echo "kafka-jars: Aiven's plugin compiled from $source" >&2
    mvn_quiet -f "$here/maven/plugin-source/pom.xml" -Daiven.src="$tree" \
      -Dbuild.dir="$work/build" package dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$work/plugin"
    cp "$work/build/$release.jar" "$work/plugin/"
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
rm -rf "$work/src" "$work/build"
rm -rf "$dir"
mv "$work" "$dir"
trap - EXIT
touch "$dir/.complete"
echo "$dir"
