"""confluent-kafka's Schema Registry client, serializers and deserializers against the bridge's
registry API (e2e/schema_registry.rs). One command a run; prints one JSON document.

  register URL USER:SECRET SUBJECT KIND FILE      -> {"id": N} or {"error_code": E, "message": M}
  lookup URL SUBJECT KIND FILE                    -> {"id", "version"} or the error
  compatible URL SUBJECT KIND FILE                -> {"is_compatible": bool}
  config URL USER:SECRET SUBJECT LEVEL            -> {"set": LEVEL, "read": LEVEL}
  serialize URL TOPIC KIND FILE OBJECTS_JSON      -> ["hex", ...] (the schema in FILE, looked up,
                                                     never registered: a device that stays on it)
  deserialize URL KIND HEX...                     -> [object, ...] (each by the id it carries)
  consume URL BOOTSTRAP TOPIC KIND COUNT          -> [{"value": object, "schema": Edge-Schema}]:
                                                     COUNT records of TOPIC read from its start
                                                     (read_committed) by a DeserializingConsumer

  proto-serialize URL USER:SECRET TOPIC MESSAGE OBJECTS_JSON
                                                  -> ["hex", ...]: ProtobufSerializer of
                                                     plant.MESSAGE (the file below), which
                                                     registers its file itself (base64
                                                     FileDescriptorProto, Confluent's form)
  proto-deserialize URL MESSAGE HEX...            -> [object, ...]: ProtobufDeserializer of
                                                     plant.MESSAGE, the writer's schema read
                                                     from the registry (format=serialized)

KIND is AVRO or JSON. Subjects follow the serializers' default strategy: <topic>-value.
The Protobuf file is built here (no protoc): package plant, importing
google/protobuf/timestamp.proto, messages Alarm {string reason = 1; int32 level = 2;
repeated string tags = 3; google.protobuf.Timestamp at = 4} and Ack {string by = 1}.
"""

import json
import sys
import time

from confluent_kafka import DeserializingConsumer, KafkaError
from confluent_kafka.error import ConsumeError

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf import timestamp_pb2  # noqa: F401 (puts the import in the default pool)


def alarm_file():
    """The messages' classes, from a FileDescriptorProto built field by field."""
    f = descriptor_pb2.FileDescriptorProto(name="plant/alarm.proto", package="plant", syntax="proto3")
    f.dependency.append("google/protobuf/timestamp.proto")
    T = descriptor_pb2.FieldDescriptorProto
    alarm = f.message_type.add(name="Alarm")
    alarm.field.add(name="reason", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL, json_name="reason")
    alarm.field.add(name="level", number=2, type=T.TYPE_INT32, label=T.LABEL_OPTIONAL, json_name="level")
    alarm.field.add(name="tags", number=3, type=T.TYPE_STRING, label=T.LABEL_REPEATED, json_name="tags")
    alarm.field.add(name="at", number=4, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                    type_name=".google.protobuf.Timestamp", json_name="at")
    ack = f.message_type.add(name="Ack")
    ack.field.add(name="by", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL, json_name="by")
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(f.name)
    except KeyError:
        pool.Add(f)
    return lambda name: message_factory.GetMessageClass(pool.FindMessageTypeByName("plant." + name))


def client(url, auth=None):
    conf = {"url": url}
    if auth:
        conf["basic.auth.user.info"] = auth
    return SchemaRegistryClient(conf)


def schema(kind, path):
    with open(path) as f:
        return Schema(f.read(), kind)


def consume(url, bootstrap, topic, kind, count):
    c = client(url)
    de = AvroDeserializer(c) if kind == "AVRO" else JSONDeserializer(None, schema_registry_client=c)
    consumer = DeserializingConsumer({
        "bootstrap.servers": bootstrap,
        "group.id": "schema-registry-reader",
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "value.deserializer": de,
    })
    consumer.subscribe([topic])
    out = []
    deadline = time.time() + 60
    while len(out) < count and time.time() < deadline:
        try:
            m = consumer.poll(0.5)
        except ConsumeError as e:
            # The sink makes a class's topic with its first record: not there yet.
            if e.code == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            raise
        if m is None or m.error():
            continue
        headers = {k: v.decode() for k, v in (m.headers() or [])}
        out.append({"value": m.value(), "schema": headers.get("Edge-Schema")})
    consumer.close()
    return out


def main(args):
    cmd = args[0]
    try:
        if cmd == "register":
            url, auth, subject, kind, path = args[1:6]
            return {"id": client(url, auth).register_schema(subject, schema(kind, path))}
        if cmd == "lookup":
            url, subject, kind, path = args[1:5]
            r = client(url).lookup_schema(subject, schema(kind, path))
            return {"id": r.schema_id, "version": r.version}
        if cmd == "compatible":
            url, subject, kind, path = args[1:5]
            return {"is_compatible": client(url).test_compatibility(subject, schema(kind, path))}
        if cmd == "config":
            url, auth, subject, level = args[1:5]
            c = client(url, auth)
            c.set_compatibility(subject_name=subject, level=level)
            return {"set": level, "read": c.get_compatibility(subject)}
        if cmd == "serialize":
            url, topic, kind, path, objects = args[1:6]
            with open(path) as f:
                text = f.read()
            conf = {"auto.register.schemas": False, "use.latest.version": False}
            c = client(url)
            if kind == "AVRO":
                ser = AvroSerializer(c, text, conf=conf)
            else:
                ser = JSONSerializer(text, c, conf=conf)
            ctx = SerializationContext(topic, MessageField.VALUE)
            return [ser(o, ctx).hex() for o in json.loads(objects)]
        if cmd == "deserialize":
            url, kind = args[1:3]
            c = client(url)
            de = AvroDeserializer(c) if kind == "AVRO" else JSONDeserializer(None, schema_registry_client=c)
            ctx = SerializationContext("any", MessageField.VALUE)
            return [de(bytes.fromhex(h), ctx) for h in args[3:]]
        if cmd == "proto-serialize":
            url, auth, topic, name, objects = args[1:6]
            cls = alarm_file()(name)
            ser = ProtobufSerializer(cls, client(url, auth), conf={"auto.register.schemas": True})
            ctx = SerializationContext(topic, MessageField.VALUE)
            return [ser(json_format.ParseDict(o, cls()), ctx).hex() for o in json.loads(objects)]
        if cmd == "proto-deserialize":
            url, name = args[1:3]
            de = ProtobufDeserializer(alarm_file()(name), {}, schema_registry_client=client(url))
            ctx = SerializationContext("any", MessageField.VALUE)
            return [json_format.MessageToDict(de(bytes.fromhex(h), ctx)) for h in args[3:]]
        if cmd == "consume":
            url, bootstrap, topic, kind, count = args[1:6]
            return consume(url, bootstrap, topic, kind, int(count))
    except SchemaRegistryError as e:
        return {"error_code": e.error_code, "message": e.error_message, "http_status": e.http_status_code}
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
