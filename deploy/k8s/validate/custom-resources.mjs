// Validates the custom resources of rendered manifests (multi-document YAML files given as
// arguments) against their operators' schemas (@kubernetes-models/prometheus-operator and
// @kubernetes-models/cert-manager: the CRD schemas compiled), and fails on any kind neither this script nor
// kubernetes-validate knows. Prints one line per resource checked; exit 1 on any error.
// (The operator's schemas, like every CRD's, allow unknown fields: the API server prunes them.
// The rules' own syntax is promtool's: `--rules-out DIR` writes each PrometheusRule's spec there
// as a rule file for `promtool check rules`.)
//
//   node custom-resources.mjs [--rules-out DIR] FILE...
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { parseAllDocuments, stringify } from "yaml";
import { PodMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";
import { Certificate } from "@kubernetes-models/cert-manager/cert-manager.io/v1/Certificate";
import { Issuer } from "@kubernetes-models/cert-manager/cert-manager.io/v1/Issuer";

const custom = {
  "monitoring.coreos.com/v1/PodMonitor": PodMonitor,
  "monitoring.coreos.com/v1/PrometheusRule": PrometheusRule,
  "cert-manager.io/v1/Certificate": Certificate,
  "cert-manager.io/v1/Issuer": Issuer,
};

let args = process.argv.slice(2);
let rulesOut = null;
if (args[0] === "--rules-out") {
  rulesOut = args[1];
  args = args.slice(2);
  mkdirSync(rulesOut, { recursive: true });
}
let errors = 0;
for (const file of args) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length) {
      console.error(`ERROR ${file}: ${doc.errors.join("; ")}`);
      errors++;
      continue;
    }
    const obj = doc.toJS();
    if (!obj) continue;
    const key = `${obj.apiVersion}/${obj.kind}`;
    const Model = custom[key];
    // Built-in kinds (no dot in the API group) are kubernetes-validate's.
    if (!Model) {
      if (obj.apiVersion.split("/")[0].includes(".") && !obj.apiVersion.endsWith(".k8s.io/v1") &&
          !obj.apiVersion.endsWith(".k8s.io/v2")) {
        console.error(`ERROR ${file}: ${key} ${obj.metadata?.name}: no schema for this kind`);
        errors++;
      }
      continue;
    }
    try {
      new Model(obj).validate();
      if (rulesOut && obj.kind === "PrometheusRule") {
        writeFileSync(`${rulesOut}/${obj.metadata.name}.yml`, stringify(obj.spec));
      }
      console.log(`ok ${file}: ${key} ${obj.metadata.name}`);
    } catch (e) {
      const msg = e.message.length > 600 ? `${e.message.slice(0, 600)}...` : e.message;
      console.error(`ERROR ${file}: ${key} ${obj.metadata?.name}: ${msg}`);
      errors++;
    }
  }
}
process.exit(errors ? 1 : 0);
