// A Connect transport whose unary calls go straight onto one node:http2
// session, for the client's plaintext default. Connect's own gRPC transport
// runs every call through a pipeline of async iterables, which costs more
// client CPU per call than the HTTP/2 exchange itself (docs/PERFORMANCE.md,
// "The TypeScript library"); a worker's calls are all unary but Watch.
// Streaming calls go to Connect's gRPC transport. The wire is gRPC's:
// one length-prefixed message, the status in the trailers (or in the
// headers of a trailers-only answer), read by Connect's own parser
// (findTrailerError: the code, the message and the details).
import http2 from "node:http2";
import { create, fromBinary, isMessage, toBinary, type DescMessage, type DescMethodStreaming, type DescMethodUnary, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type ContextValues, type StreamResponse, type Transport, type UnaryResponse } from "@connectrpc/connect";
import { codeFromHttpStatus, findTrailerError } from "@connectrpc/connect/protocol-grpc";
import { createGrpcTransport } from "@connectrpc/connect-node";

const { NGHTTP2_CANCEL } = http2.constants;

/** webHeaders copies HTTP/2 headers (pseudo-headers left out) into a Headers. */
function webHeaders(h: http2.IncomingHttpHeaders | undefined): Headers {
  const out = new Headers();
  if (!h) return out;
  for (const k in h) {
    if (k.charCodeAt(0) === 58 /* ':' */) continue;
    const v = h[k];
    if (Array.isArray(v)) for (const x of v) out.append(k, x);
    else if (v !== undefined) out.set(k, String(v));
  }
  return out;
}

/**
 * A transport for intentd at `http://<address>`: unary calls on one HTTP/2
 * session of its own (opened at first use, again after it closed, and
 * unreferenced while no call is under way, so it never keeps Node
 * running); streaming calls on Connect's gRPC transport.
 */
export function createIntentdTransport(address: string): Transport & { close(): void } {
  const baseUrl = `http://${address}`;
  const streams = createGrpcTransport({ baseUrl });
  let session: http2.ClientHttp2Session | undefined;
  let active = 0;

  function connect(): http2.ClientHttp2Session {
    if (session && !session.closed && !session.destroyed) return session;
    const s = http2.connect(baseUrl);
    s.on("error", () => {}); // each stream reports its own failure
    const drop = () => {
      if (session === s) session = undefined;
    };
    s.on("close", drop);
    s.on("goaway", drop);
    s.unref();
    session = s;
    return s;
  }

  function unary<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    signal: AbortSignal | undefined,
    timeoutMs: number | undefined,
    header: ConstructorParameters<typeof Headers>[0] | undefined,
    input: MessageInitShape<I>,
    _contextValues?: ContextValues,
  ): Promise<UnaryResponse<I, O>> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(ConnectError.from(signal.reason, Code.Canceled));
        return;
      }
      const body = toBinary(method.input, isMessage(input, method.input) ? input : create(method.input, input));
      const frame = Buffer.allocUnsafe(5 + body.byteLength);
      frame[0] = 0;
      frame.writeUInt32BE(body.byteLength, 1);
      frame.set(body, 5);
      const headers: http2.OutgoingHttpHeaders = {
        ":method": "POST",
        ":path": `/${method.parent.typeName}/${method.name}`,
        "content-type": "application/grpc+proto",
        te: "trailers",
        "user-agent": "intentd-ts",
      };
      if (timeoutMs !== undefined && timeoutMs > 0) headers["grpc-timeout"] = `${Math.ceil(timeoutMs)}m`;
      if (header instanceof Headers || Array.isArray(header)) new Headers(header).forEach((v, k) => (headers[k.toLowerCase()] = v));
      else if (header) for (const k in header) headers[k.toLowerCase()] = header[k] as string;

      const s = connect();
      if (active++ === 0) s.ref();
      let stream: http2.ClientHttp2Stream;
      try {
        stream = s.request(headers);
      } catch (err) {
        if (--active === 0) s.unref();
        reject(new ConnectError(`no answer from ${address}: ${String(err)}`, Code.Unavailable, undefined, undefined, err));
        return;
      }
      let respHeaders: http2.IncomingHttpHeaders | undefined;
      let trailers: http2.IncomingHttpHeaders | undefined;
      const chunks: Buffer[] = [];
      let failed: ConnectError | undefined;
      let timer: NodeJS.Timeout | undefined;
      const onAbort = () => {
        failed ??= ConnectError.from(signal!.reason, Code.Canceled);
        stream.close(NGHTTP2_CANCEL);
      };
      if (timeoutMs !== undefined && timeoutMs > 0) {
        timer = setTimeout(() => {
          failed ??= new ConnectError("the operation timed out", Code.DeadlineExceeded);
          stream.close(NGHTTP2_CANCEL);
        }, timeoutMs);
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      stream.on("response", (h) => (respHeaders = h));
      stream.on("data", (c: Buffer) => chunks.push(c));
      stream.on("trailers", (t) => (trailers = t));
      stream.on("error", (err) => {
        failed ??= new ConnectError(`no answer from ${address}: ${err.message}`, Code.Unavailable, undefined, undefined, err);
      });
      stream.on("close", () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        if (--active === 0 && !s.destroyed) s.unref();
        if (failed) return reject(failed);
        if (!respHeaders) return reject(new ConnectError(`stream closed (${stream.rstCode})`, Code.Unavailable));
        const status = Number(respHeaders[":status"]);
        if (status !== 200) return reject(new ConnectError(`HTTP ${status}`, codeFromHttpStatus(status)));
        const t = webHeaders(trailers ?? respHeaders);
        const err = findTrailerError(t);
        if (err) return reject(err);
        if (!t.has("grpc-status")) return reject(new ConnectError("no grpc-status in the answer", Code.Internal));
        const data = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
        if (data.length < 5 || data[0] !== 0) return reject(new ConnectError("an answer that is not one uncompressed message", Code.Internal));
        const len = data.readUInt32BE(1);
        if (data.length !== 5 + len) return reject(new ConnectError("an answer of the wrong length", Code.Internal));
        try {
          resolve({
            stream: false,
            service: method.parent,
            method,
            header: webHeaders(respHeaders),
            trailer: t,
            message: fromBinary(method.output, data.subarray(5)),
          } as UnaryResponse<I, O>);
        } catch (e) {
          reject(new ConnectError(`cannot decode the answer: ${String(e)}`, Code.Internal));
        }
      });
      stream.end(frame);
    });
  }

  return {
    unary,
    /** Closes the unary calls' HTTP/2 session (calls under way finish; a later call opens a new one). */
    close(): void {
      session?.close();
      session = undefined;
    },
    stream<I extends DescMessage, O extends DescMessage>(
      method: DescMethodStreaming<I, O>,
      signal: AbortSignal | undefined,
      timeoutMs: number | undefined,
      header: ConstructorParameters<typeof Headers>[0] | undefined,
      input: AsyncIterable<MessageInitShape<I>>,
      contextValues?: ContextValues,
    ): Promise<StreamResponse<I, O>> {
      return streams.stream(method, signal, timeoutMs, header, input, contextValues);
    },
  };
}
