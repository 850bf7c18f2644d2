package dev.tideline.elasticsearch;

import org.elasticsearch.Build;
import org.elasticsearch.client.internal.node.NodeClient;
import org.elasticsearch.cluster.service.ClusterService;
import org.elasticsearch.common.bytes.BytesArray;
import org.elasticsearch.rest.RestChannel;
import org.elasticsearch.rest.RestHandler;
import org.elasticsearch.rest.RestRequest;
import org.elasticsearch.rest.RestResponse;
import org.elasticsearch.rest.RestStatus;
import org.elasticsearch.xcontent.XContentBuilder;

import java.util.List;

/**
 * {@code GET /} and {@code HEAD /} (the "info"/"ping" APIs).
 *
 * <p>Since 8.12 these endpoints live in the distribution module {@code rest-root}, which Elastic
 * does not publish to Maven Central, so a classpath-assembled node answers 405 on {@code /}.
 * Clients and tools use this endpoint for version detection (e.g. {@code es.info()},
 * {@code es.ping()}, {@code curl localhost:9200}), so we register an equivalent handler on the
 * node's own RestController. Values come from the running node (build info, cluster UUID).
 */
final class RootInfoHandler implements RestHandler {

    private final ClusterService clusterService;

    RootInfoHandler(ClusterService clusterService) {
        this.clusterService = clusterService;
    }

    @Override
    public List<Route> routes() {
        return List.of(new Route(RestRequest.Method.GET, "/"), new Route(RestRequest.Method.HEAD, "/"));
    }

    @Override
    public void handleRequest(RestRequest request, RestChannel channel, NodeClient client) throws Exception {
        if (request.method() == RestRequest.Method.HEAD) {
            channel.sendResponse(new RestResponse(RestStatus.OK, RestResponse.TEXT_CONTENT_TYPE, BytesArray.EMPTY));
            return;
        }
        Build build = Build.current();
        var state = clusterService.state();
        XContentBuilder b = channel.newBuilder();
        b.startObject();
        b.field("name", clusterService.getNodeName());
        b.field("cluster_name", state.getClusterName().value());
        b.field("cluster_uuid", state.metadata().clusterUUID());
        b.startObject("version");
        b.field("number", build.qualifiedVersion());
        b.field("build_flavor", build.flavor());
        b.field("build_type", build.type().displayName());
        b.field("build_hash", build.hash());
        b.field("build_date", build.date());
        b.field("build_snapshot", build.isSnapshot());
        b.field("lucene_version", org.apache.lucene.util.Version.LATEST.toString());
        b.field("minimum_wire_compatibility_version", build.minWireCompatVersion());
        b.field("minimum_index_compatibility_version", build.minIndexCompatVersion());
        b.endObject();
        b.field("tagline", "You Know, for Search");
        b.endObject();
        channel.sendResponse(new RestResponse(RestStatus.OK, b));
    }
}
