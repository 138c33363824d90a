"""mnemo.v1.AdminService: tenants and API keys (admin key only)."""

from __future__ import annotations

import grpc

from mnemo.v1 import admin_service_pb2 as pb
from mnemo.v1 import admin_service_pb2_grpc as pb_grpc
from mnemo_server.api import convert
from mnemo_server.api.interceptor import current_principal
from mnemo_server.errors import InvalidArgument
from mnemo_server.memory.validation import Validator
from mnemo_server.ranking.outbox import FeedbackDelivery
from mnemo_server.store.tenant_repo import ApiKeyRow, TenantRow
from mnemo_server.tenancy.tenants import TenantService, require_admin


def _tenant_pb(t: TenantRow) -> pb.Tenant:
    return pb.Tenant(id=t.id, display_name=t.display_name, create_time=convert.ns_to_ts(t.create_time_ns))


def _key_pb(k: ApiKeyRow) -> pb.ApiKey:
    out = pb.ApiKey(
        id=k.id,
        tenant_id=k.tenant_id,
        description=k.description,
        create_time=convert.ns_to_ts(k.create_time_ns),
    )
    if k.revoke_time_ns is not None:
        out.revoke_time.CopyFrom(convert.ns_to_ts(k.revoke_time_ns))
    return out


def _admin() -> None:
    require_admin(current_principal())


class AdminServicer(pb_grpc.AdminServiceServicer):
    def __init__(self, tenants: TenantService, validator: Validator, feedback: FeedbackDelivery):
        self.tenants = tenants
        self.validator = validator
        self.feedback = feedback

    def CreateTenant(
        self, request: pb.CreateTenantRequest, context: grpc.ServicerContext
    ) -> pb.CreateTenantResponse:
        _admin()
        self.validator.request_id(request.request_id)
        t = self.tenants.create_tenant(
            request.tenant.id,
            request.tenant.display_name,
            convert.idempotency_key("CreateTenant", request, request.request_id),
        )
        return pb.CreateTenantResponse(tenant=_tenant_pb(t))

    def GetTenant(self, request: pb.GetTenantRequest, context: grpc.ServicerContext) -> pb.GetTenantResponse:
        _admin()
        if not request.id:
            raise InvalidArgument("id", "is required")
        return pb.GetTenantResponse(tenant=_tenant_pb(self.tenants.get_tenant(request.id)))

    def ListTenants(
        self, request: pb.ListTenantsRequest, context: grpc.ServicerContext
    ) -> pb.ListTenantsResponse:
        _admin()
        rows, token = self.tenants.list_tenants(
            self.validator.page_size(request.page_size), request.page_token
        )
        return pb.ListTenantsResponse(tenants=[_tenant_pb(t) for t in rows], next_page_token=token)

    def CreateApiKey(
        self, request: pb.CreateApiKeyRequest, context: grpc.ServicerContext
    ) -> pb.CreateApiKeyResponse:
        _admin()
        if not request.tenant_id:
            raise InvalidArgument("tenant_id", "is required")
        self.validator.request_id(request.request_id)
        row, secret = self.tenants.create_key(
            request.tenant_id,
            request.description,
            convert.idempotency_key("CreateApiKey", request, request.request_id),
        )
        return pb.CreateApiKeyResponse(api_key=_key_pb(row), secret=secret)

    def ListApiKeys(
        self, request: pb.ListApiKeysRequest, context: grpc.ServicerContext
    ) -> pb.ListApiKeysResponse:
        _admin()
        if not request.tenant_id:
            raise InvalidArgument("tenant_id", "is required")
        rows, token = self.tenants.list_keys(
            request.tenant_id, self.validator.page_size(request.page_size), request.page_token
        )
        return pb.ListApiKeysResponse(api_keys=[_key_pb(k) for k in rows], next_page_token=token)

    def RevokeApiKey(
        self, request: pb.RevokeApiKeyRequest, context: grpc.ServicerContext
    ) -> pb.RevokeApiKeyResponse:
        _admin()
        if not request.id:
            raise InvalidArgument("id", "is required")
        return pb.RevokeApiKeyResponse(api_key=_key_pb(self.tenants.revoke_key(request.id)))

    def RetryUndeliverableFeedback(
        self, request: pb.RetryUndeliverableFeedbackRequest, context: grpc.ServicerContext
    ) -> pb.RetryUndeliverableFeedbackResponse:
        _admin()
        return pb.RetryUndeliverableFeedbackResponse(requeued=self.feedback.retry_parked())
