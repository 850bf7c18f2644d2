package dev.tideline.elasticsearch;

import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.config.Configurator;
import org.elasticsearch.cluster.service.ClusterService;
import org.elasticsearch.common.logging.LogConfigurator;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.env.Environment;
import org.elasticsearch.node.InternalSettingsPreparer;
import org.elasticsearch.node.Node;
import org.elasticsearch.plugins.PluginsLoader;
import org.elasticsearch.rest.RestController;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.TreeMap;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;

/**
 * Starts one real Elasticsearch node in this JVM, with everything on the plain classpath.
 *
 * <p>The official distribution starts the server on the module path through a separate CLI
 * process; that CLI and the distribution archive are not on Maven Central. Instead we build the
 * node ourselves from the public {@code Node(Environment, PluginsLoader)} constructor.
 *
 * <p>Usage: {@code java ... dev.tideline.elasticsearch.TidelineElasticsearch -Epath.home=DIR
 * -Ehttp.port=19200 ...}. Every {@code -Ekey=value} is an Elasticsearch setting (same syntax as
 * the real {@code bin/elasticsearch}); the defaults below make a single-node, loopback-only,
 * security-less development node. Stop it with SIGTERM (kill PID): a shutdown hook closes the
 * node cleanly.
 */
public final class TidelineElasticsearch {

    private TidelineElasticsearch() {}

    public static void main(String[] args) {
        try {
            run(args);
        } catch (Throwable t) {
            // Node threads are non-daemon: without an explicit exit a failed start would hang.
            t.printStackTrace();
            System.exit(1);
        }
    }

    private static void run(String[] args) throws Exception {
        Settings overrides = parseArgs(args);
        Path home = Path.of(overrides.get("path.home", "es-home")).toAbsolutePath();

        // Dev defaults; any -E argument wins (applied last).
        Settings settings = Settings.builder()
            .put("cluster.name", "tideline")
            .put("node.name", "tideline-es")
            // Bind only to loopback: with a loopback address ES skips the production bootstrap
            // checks (vm.max_map_count, file descriptors, heap == max heap, ...).
            .put("network.host", "127.0.0.1")
            // One node that elects itself master; no discovery / cluster bootstrapping.
            .put("discovery.type", "single-node")
            // Never flip indices to read-only because the shared disk is nearly full.
            .put("cluster.routing.allocation.disk.threshold_enabled", false)
            // Security needs no setting: there is no x-pack on the classpath, so no security,
            // ML, ILM... (and xpack.* settings are rejected as unknown).
            .put("path.data", home.resolve("data").toString())
            .put("path.logs", home.resolve("logs").toString())
            .put(overrides)
            .put("path.home", home.toString())
            .build();

        // The node expects HOME/config, HOME/modules and HOME/plugins to exist.
        Path config = home.resolve("config");
        Files.createDirectories(config);
        Files.createDirectories(home.resolve("plugins"));
        installModules(moduleSource(), home.resolve("modules"));
        writeLoggingConfig(config.resolve("log4j2.properties"));

        Environment env = InternalSettingsPreparer.prepareEnvironment(settings, Map.of(), config,
            () -> settings.get("node.name"));

        // Elasticsearch's log4j setup (ES-specific layouts/appenders need this before any logger
        // is created); reads HOME/config/log4j2.properties, keeps logging to the console.
        LogConfigurator.setNodeName(env.settings().get("node.name"));
        LogConfigurator.setClusterName(env.settings().get("cluster.name"));
        LogConfigurator.configure(env, true);

        // Modules are found as bundles under HOME/modules (see installModules).
        // withServerExports=false: the server is in the unnamed module here, so there are no
        // JPMS qualified exports to wire up (the distribution's module-path setup needs them).
        PluginsLoader plugins = PluginsLoader.createPluginsLoader(
            PluginsLoader.loadModulesBundles(env.modulesDir()),
            PluginsLoader.loadPluginsBundles(env.pluginsDir()),
            Map.of(),
            false);

        long t0 = System.nanoTime();
        Node node = new Node(env, plugins);
        // GET / and HEAD / (rest-root module is not on Maven Central): see RootInfoHandler.
        node.injector().getInstance(RestController.class)
            .registerHandler(new RootInfoHandler(node.injector().getInstance(ClusterService.class)));
        node.start();
        System.out.printf("tideline-es: started in %d ms (http %s)%n",
            TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0), settings.get("http.port", "9200"));

        // Close the node (flush, release locks on path.data) on SIGTERM/SIGINT.
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(30, TimeUnit.SECONDS);
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                // Run with -Dlog4j.shutdownHookEnabled=false so log4j stays up until the node
                // has logged its shutdown; stop it last.
                Configurator.shutdown((LoggerContext) LogManager.getContext(false));
                stopped.countDown();
            }
        }, "tideline-es-shutdown"));
        stopped.await(); // keep a non-daemon thread alive while the node runs
    }

    /** Module jars: -Dtideline.es.modules, else the es-modules/ dir next to this launcher jar. */
    private static Path moduleSource() throws Exception {
        String prop = System.getProperty("tideline.es.modules");
        if (prop != null) {
            return Path.of(prop).toAbsolutePath();
        }
        Path self = Path.of(TidelineElasticsearch.class.getProtectionDomain().getCodeSource().getLocation().toURI());
        return self.getParent().resolve("es-modules");
    }

    /** Parses {@code -Ekey=value} or {@code -E key=value} arguments, like bin/elasticsearch. */
    private static Settings parseArgs(String[] args) {
        Settings.Builder b = Settings.builder();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (a.equals("-E") && i + 1 < args.length) {
                a = args[++i];
            } else if (a.startsWith("-E")) {
                a = a.substring(2);
            } else {
                throw new IllegalArgumentException("expected -Ekey=value, got: " + a);
            }
            int eq = a.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("expected -Ekey=value, got: " + a);
            }
            b.put(a.substring(0, eq), a.substring(eq + 1));
        }
        return b.build();
    }

    /**
     * Installs module jars as HOME/modules/NAME/ bundles, the layout of the real distribution.
     *
     * <p>Each published module jar carries META-INF/es-plugins/NAME/plugin-descriptor.properties
     * (Elastic's test framework uses it). We copy that descriptor, dropping the "modulename"
     * line: a modular descriptor makes ES load the module into its own JPMS layer, which only
     * works when the server itself runs as a named module on the module path. Non-modular, the
     * module gets a plain URLClassLoader whose parent is our classpath (server + libs). The
     * module jar plus every non-module jar of the source dir (netty, ssl-config) go in the
     * bundle; they must NOT also be on the classpath (ES rejects a Plugin class that the parent
     * loader could load, and its jar-hell check rejects duplicate jars).
     */
    static void installModules(Path sourceDir, Path modulesDir) throws IOException {
        Files.createDirectories(modulesDir);
        if (!Files.isDirectory(sourceDir)) {
            throw new IllegalStateException("module jar dir not found: " + sourceDir
                + " (set -Dtideline.es.modules=DIR; without transport-netty4 there is no HTTP)");
        }
        Pattern entryName = Pattern.compile("META-INF/es-plugins/([^/]+)/plugin-descriptor\\.properties");
        Map<Path, String[]> moduleJars = new TreeMap<>(); // jar -> {name, descriptor text}
        List<Path> libJars = new ArrayList<>();
        try (var files = Files.list(sourceDir)) {
            for (Path jarPath : files.filter(f -> f.toString().endsWith(".jar")).sorted().toList()) {
                String[] found = null;
                try (ZipFile jar = new ZipFile(jarPath.toFile())) {
                    for (ZipEntry e : Collections.list(jar.entries())) {
                        Matcher m = entryName.matcher(e.getName());
                        if (m.matches()) {
                            try (InputStream in = jar.getInputStream(e)) {
                                String text = new String(in.readAllBytes(), StandardCharsets.UTF_8).lines()
                                    .filter(l -> !l.startsWith("modulename="))
                                    .collect(Collectors.joining("\n", "", "\n"));
                                found = new String[] { m.group(1), text };
                            }
                        }
                    }
                }
                if (found != null) {
                    moduleJars.put(jarPath, found);
                } else {
                    libJars.add(jarPath);
                }
            }
        }
        for (Map.Entry<Path, String[]> module : moduleJars.entrySet()) {
            Path target = modulesDir.resolve(module.getValue()[0]);
            Files.createDirectories(target);
            // Drop jars left by an earlier run (e.g. another es.version): duplicates = jar hell.
            try (var old = Files.list(target)) {
                for (Path f : old.filter(f -> f.toString().endsWith(".jar")).toList()) {
                    Files.delete(f);
                }
            }
            Files.writeString(target.resolve("plugin-descriptor.properties"), module.getValue()[1]);
            List<Path> jars = new ArrayList<>(libJars);
            jars.add(module.getKey());
            for (Path jar : jars) {
                Files.copy(jar, target.resolve(jar.getFileName()), StandardCopyOption.REPLACE_EXISTING);
            }
        }
    }

    /** Minimal log4j2 config: console + HOME/logs/CLUSTER.log, INFO level. Written once. */
    private static void writeLoggingConfig(Path file) throws IOException {
        if (Files.exists(file)) {
            return; // respect a hand-edited config
        }
        Files.writeString(file, String.join("\n",
            "status = error",
            "appender.console.type = Console",
            "appender.console.name = console",
            "appender.console.layout.type = PatternLayout",
            "appender.console.layout.pattern = [%d{ISO8601}][%-5p][%-25c{1.}] [%node_name]%marker %m%n",
            "appender.file.type = File",
            "appender.file.name = file",
            "appender.file.fileName = ${sys:es.logs.base_path}${sys:file.separator}${sys:es.logs.cluster_name}.log",
            "appender.file.layout.type = PatternLayout",
            "appender.file.layout.pattern = [%d{ISO8601}][%-5p][%-25c{1.}] [%node_name]%marker %m%n",
            "rootLogger.level = info",
            "rootLogger.appenderRef.console.ref = console",
            "rootLogger.appenderRef.file.ref = file",
            ""));
    }
}
