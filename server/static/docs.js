// Starts Swagger UI from the files this server serves (no CDN, works offline); kept out of the
// page so the Content-Security-Policy can refuse every inline script.
window.addEventListener("DOMContentLoaded", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
