#!/bin/sh
# The jars of a Kafka Connect worker and of Aiven's S3 sink connector, resolved by Maven from the POMs in
# maven/connect and maven/s3-sink and kept in a cache folder outside the repository:
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tsproxy/kafka-connect/<hash of the POMs and this script>/connect/*.jar
#                                                                            /plugins/s3-sink/*.jar
#
# `plugins/` is the worker's plugin.path; the connector has a folder of its own there. A complete folder is
# reused as it is (Maven's own downloads stay in ~/.m2). Usage:
#
#   deploy/kafka/connect-jars.sh          build the folder if it is not there yet; print its path
#   deploy/kafka/connect-jars.sh --dir    print the path only (the tests use it to find the jars)
#
# The worker (connect-runtime) and the connector's dependencies come from Maven Central. The connector's
# own jar, s3-connector-for-apache-kafka-2.15.0.jar, is not published there: it is taken from the release
# Aiven distributes (the jar itself, or the release's .tar/.zip, or that archive unpacked), looked for at
# $AIVEN_S3_SINK, then in <cache>/tsproxy/kafka-connect/src/. Without it the worker is still installed
# and plugins/ is left out: the Connect tests then skip, saying so.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/tsproxy/kafka-connect"
release=s3-connector-for-apache-kafka-2.15.0
hash=$(cat "$here/connect-jars.sh" "$here/maven/connect/pom.xml" "$here/maven/s3-sink/pom.xml" \
  | sha256sum | cut -c1-16)
dir="$cache_root/$hash"

if [ "${1:-}" = "--dir" ]; then
  echo "$dir"
  exit 0
fi

find_release() {
  if [ -n "${AIVEN_S3_SINK:-}" ]; then
    echo "$AIVEN_S3_SINK"
    return
  fi
  for candidate in "$cache_root/src/$release.jar" "$cache_root/src/$release.tar" \
    "$cache_root/src/$release.zip" "$cache_root/src/$release"; do
    if [ -e "$candidate" ]; then
      echo "$candidate"
      return
    fi
  done
}
source=$(find_release)

# A complete folder is reused, unless it lacks the connector and a release has turned up since.
if [ -f "$dir/.complete" ] && { [ -d "$dir/plugins/s3-sink" ] || [ -z "$source" ]; }; then
  echo "$dir"
  exit 0
fi

if ! command -v mvn >/dev/null 2>&1 || ! command -v jar >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends maven default-jdk-headless >/dev/null
fi

work="$dir.partial.$$"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
mvn_quiet() { mvn -B -q "$@" >"$work/mvn.log" 2>&1 || { tail -40 "$work/mvn.log" >&2; return 1; }; }

mvn_quiet -f "$here/maven/connect/pom.xml" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$work/connect"

if [ -z "$source" ]; then
  echo "kafka-connect-jars: $release.jar not found (set AIVEN_S3_SINK to the jar or to the release's" >&2
  echo "kafka-connect-jars: archive, or put it in $cache_root/src); the Connect tests will skip" >&2
else
  plugin="$work/plugins/s3-sink"
  mvn_quiet -f "$here/maven/s3-sink/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$plugin"
  case "$source" in
    *.jar) cp "$source" "$plugin/$release.jar" ;;
    *)
      mkdir -p "$work/unpack"
      case "$source" in
        *.tar | *.tar.gz | *.tgz) tar -xf "$source" -C "$work/unpack" ;;
        *.zip) unzip -q "$source" -d "$work/unpack" ;;
        *) cp -r "$source" "$work/unpack/" ;;
      esac
      jar=$(find "$work/unpack" -name "$release.jar" | head -1)
      if [ -z "$jar" ]; then
        echo "kafka-connect-jars: no $release.jar in $source" >&2
        exit 1
      fi
      cp "$jar" "$plugin/$release.jar"
      rm -rf "$work/unpack"
      ;;
  esac
  if ! unzip -Z1 "$plugin/$release.jar" | grep -q '^io/aiven/kafka/connect/s3/AivenKafkaConnectS3SinkConnector.class$'; then
    echo "kafka-connect-jars: $source holds no io.aiven.kafka.connect.s3.AivenKafkaConnectS3SinkConnector" >&2
    exit 1
  fi
  # The connector jar declares no ServiceLoader manifest; a jar of its own beside it does, so the worker
  # finds the connector with plugin.discovery=service_load instead of scanning every class of the folder
  # (about 30 s of CPU at each start).
  mkdir -p "$work/manifest/META-INF/services"
  echo io.aiven.kafka.connect.s3.AivenKafkaConnectS3SinkConnector \
    >"$work/manifest/META-INF/services/org.apache.kafka.connect.sink.SinkConnector"
  (cd "$work/manifest" && jar cf "$plugin/s3-sink-service-manifest.jar" META-INF)
  rm -rf "$work/manifest"
  # Connect loads a plugin folder child first: a copy of Kafka's own classes or of SLF4J/a logging
  # binding there would shadow the worker's (commons-logging is the AWS SDK's own and stays).
  for jar in "$plugin"/*.jar; do
    if unzip -Z1 "$jar" | grep -q -E '^(org/apache/kafka/|org/slf4j/|org/apache/logging/|ch/qos/|org/apache/log4j/)'; then
      echo "kafka-connect-jars: $(basename "$jar") holds Kafka, SLF4J or logging classes; refusing" >&2
      exit 1
    fi
  done
fi

rm -f "$work/mvn.log"
rm -rf "$dir"
mv "$work" "$dir"
trap - EXIT
touch "$dir/.complete"
echo "$dir"
