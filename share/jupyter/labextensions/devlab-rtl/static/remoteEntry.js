// devlab's right-to-left stylesheet for JupyterLab, as a prebuilt ("federated") extension
// with no code of its own. JupyterLab finds this folder in share/jupyter/labextensions (devlab's
// wheel puts it there), loads this script, calls init() and then get("./style"), as it does
// with a container webpack's module federation builds; the style module links rtl.css, which
// sits beside this file, into the page. Written by hand, so installing devlab needs no Node.js.
// The same rtl.css is inlined into the pages tools/render.py writes.
var _JUPYTERLAB;
(function () {
  "use strict";
  var script = document.currentScript;
  var href = new URL("rtl.css?v=0.1.0", script ? script.src : document.baseURI).href;
  function link() {
    if (!document.querySelector('link[data-devlab="rtl"]')) {
      var el = document.createElement("link");
      el.rel = "stylesheet";
      el.href = href;
      el.setAttribute("data-devlab", "rtl");
      document.head.appendChild(el);
    }
    return {};
  }
  _JUPYTERLAB = _JUPYTERLAB || {};
  _JUPYTERLAB["devlab-rtl"] = {
    init: function () {},  // shares no modules and needs none
    get: function (module) {
      if (module === "./style") {
        return Promise.resolve(link);
      }
      return Promise.reject(new Error("devlab-rtl has no module " + module));
    }
  };
})();
