import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { AcquireRequestSchema } from "../../gen/ts/intent/v1/intent_pb.js";

test("stubs load", () => {
  assert.equal(create(AcquireRequestSchema, { key: "k" }).key, "k");
});
