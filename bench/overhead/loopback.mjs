// Preloaded with `node --import` before the Portkey gateway, which has no listen-address
// option and binds every interface: every listen() is forced onto 127.0.0.1.
import net from "node:net";

const listen = net.Server.prototype.listen;

net.Server.prototype.listen = function (...args) {
  const callback = args.find((a) => typeof a === "function");
  const first = args[0];
  if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
    return listen.call(this, { port: Number(first), host: "127.0.0.1" }, callback);
  }
  if (first !== null && typeof first === "object" && !("fd" in first) && !("path" in first)) {
    return listen.call(this, { ...first, host: "127.0.0.1" }, callback);
  }
  return listen.apply(this, args);
};
