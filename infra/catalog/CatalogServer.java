/*
 * The platform's Iceberg REST catalog server: Apache Iceberg's own REST server
 * (iceberg-open-api's RESTCatalogServer adapter and servlet) over a JdbcCatalog on
 * PostgreSQL (docs/adr/0006-iceberg-catalog.md), with two changes users need:
 *
 * 1. It binds one address (REST_HOST, default 127.0.0.1). Upstream builds Jetty
 *    with `new Server(port)`, which listens on every interface with no setting to
 *    change it, so anyone on the network could create or drop tables.
 * 2. It tells clients how to reach the table files: every CLIENT_* variable becomes
 *    a default in `GET /v1/config` (named like CATALOG_*: `__` is `-`, `_` is `.`,
 *    e.g. CLIENT_S3_ENDPOINT -> s3.endpoint). pyiceberg and Spark merge those
 *    defaults under their own settings, so a client needs only the catalog's
 *    address and anything it sets itself still wins.
 *
 * Everything else is upstream's: CATALOG_* variables become catalog properties
 * (RCKUtils.environmentCatalogConfig) and CATALOG_REST_PORT is the port. The class
 * sits in the upstream package because the adapter classes are package-private.
 */
package org.apache.iceberg.rest;

import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.rest.responses.ConfigResponse;
import org.apache.iceberg.util.PropertyUtil;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.handler.gzip.GzipHandler;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public final class CatalogServer {
  private static final String CLIENT_PREFIX = "CLIENT_";

  private CatalogServer() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> props = new HashMap<>(RCKUtils.environmentCatalogConfig());
    String name = PropertyUtil.propertyAsString(props, "catalog.name", "rest_backend");
    Catalog catalog = CatalogUtil.buildIcebergCatalog(name, props, new Configuration());
    RESTCatalogAdapter adapter =
        new ClientConfigAdapter(new RESTCatalogServer.CatalogContext(catalog, props), clientDefaults());

    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(adapter)), "/*");
    context.insertHandler(new GzipHandler());

    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost(System.getenv().getOrDefault("REST_HOST", "127.0.0.1"));
    connector.setPort(PropertyUtil.propertyAsInt(props, "rest.port", 8181));
    server.addConnector(connector);
    server.setHandler(context);
    server.start();
    server.join();
  }

  /** CLIENT_* variables as client properties (the CATALOG_* naming rule). */
  static Map<String, String> clientDefaults() {
    Map<String, String> defaults = new HashMap<>();
    System.getenv()
        .forEach(
            (key, value) -> {
              if (key.startsWith(CLIENT_PREFIX) && !value.isEmpty()) {
                String name =
                    key.substring(CLIENT_PREFIX.length())
                        .replace("__", "-")
                        .replace("_", ".")
                        .toLowerCase(Locale.ROOT);
                defaults.put(name, value);
              }
            });
    return defaults;
  }

  /** Upstream's adapter, with the client defaults added to `GET /v1/config`. */
  static final class ClientConfigAdapter extends RESTServerCatalogAdapter {
    private final Map<String, String> clientDefaults;

    ClientConfigAdapter(RESTCatalogServer.CatalogContext context, Map<String, String> defaults) {
      super(context);
      this.clientDefaults = Map.copyOf(defaults);
    }

    @Override
    public <T extends RESTResponse> T handleRequest(
        Route route, Map<String, String> vars, Object body, Class<T> responseType) {
      T response = super.handleRequest(route, vars, body, responseType);
      if (route != Route.CONFIG || !(response instanceof ConfigResponse config)) {
        return response;
      }
      Map<String, String> defaults = new HashMap<>(clientDefaults);
      defaults.putAll(config.defaults());
      return responseType.cast(
          ConfigResponse.builder()
              .withDefaults(defaults)
              .withOverrides(config.overrides())
              .withEndpoints(config.endpoints())
              .build());
    }
  }
}
